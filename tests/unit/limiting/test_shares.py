"""How a biz_type's limits are split among the shards (timeouts/limiting/shares.py): the parts add up
to the whole, a shard keeps what it runs, and the rest follows the due tasks."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from timeouts.limiting.shares import RESERVE, concurrency_parts, rate_parts

shard_counts = st.integers(min_value=1, max_value=8)


def test_with_nothing_due_a_rate_is_split_evenly():
    assert rate_parts([0, 0, 0, 0]) == [0.25] * 4


def test_a_rate_keeps_a_tenth_evenly_and_gives_the_rest_after_the_due_tasks():
    assert rate_parts([30, 0, 10]) == pytest.approx([RESERVE / 3 + 0.9 * 0.75, RESERVE / 3, RESERVE / 3 + 0.9 * 0.25])


@given(st.lists(st.integers(min_value=0, max_value=10_000), min_size=1, max_size=8))
def test_rate_parts_are_never_zero_and_add_up_to_the_whole(dues):
    parts = rate_parts(dues)
    assert min(parts) > 0
    assert sum(parts) == pytest.approx(1)


def test_concurrency_goes_where_the_tasks_are_due():
    assert concurrency_parts(5, [0, 0, 0], [10, 0, 0]) == [5, 0, 0]
    assert concurrency_parts(10, [3, 1, 0], [4, 4, 0]) == [6, 4, 0]


def test_concurrency_nobody_needs_is_split_evenly():
    assert concurrency_parts(5, [0, 0, 0], [0, 0, 0]) == [2, 2, 1]
    assert concurrency_parts(8, [0, 0], [1, 0]) == [5, 3]


def test_a_shard_keeps_what_it_runs_even_beyond_the_limit():
    assert concurrency_parts(2, [2, 1, 0], [5, 5, 5]) == [2, 1, 0]


@given(st.data(), shard_counts, st.integers(min_value=1, max_value=200))
def test_concurrency_parts_cover_what_runs_and_add_up_to_the_limit(data, count, limit):
    in_flight = data.draw(st.lists(st.integers(min_value=0, max_value=limit), min_size=count, max_size=count))
    dues = data.draw(st.lists(st.integers(min_value=0, max_value=10_000), min_size=count, max_size=count))
    parts = concurrency_parts(limit, in_flight, dues)
    assert all(part >= running for part, running in zip(parts, in_flight, strict=True))
    assert sum(parts) == max(limit, sum(in_flight))
