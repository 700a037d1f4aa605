"""The durable_restart scenario's count of calls run twice, split by whether the kill explains them."""

from datetime import UTC, datetime, timedelta

from benchmarks.durable import _twice

BASE = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds):
    return BASE + timedelta(seconds=seconds)


def test_a_call_started_just_before_the_kill_and_again_after_the_restart_ran_twice_at_the_kill():
    expected = {1: at(0), 2: at(0), 3: at(0)}
    starts = [(1, at(9.998)), (1, at(16)), (2, at(9)), (3, at(20))]

    out = _twice(expected, starts, killed_at=at(10).timestamp(), restarted_at=at(15).timestamp())

    assert out == {"duplicates_at_kill": 1, "duplicates_other": 0, "twice_started_before_kill_ms": 2.0}


def test_calls_run_twice_on_one_side_of_the_kill_are_counted_apart():
    expected = {1: at(0), 2: at(0), 3: at(0)}
    starts = [(1, at(8)), (1, at(9)), (2, at(16)), (2, at(17)), (3, at(9)), (3, at(16)), (3, at(17))]

    out = _twice(expected, starts, killed_at=at(10).timestamp(), restarted_at=at(15).timestamp())

    assert out == {"duplicates_at_kill": 0, "duplicates_other": 4, "twice_started_before_kill_ms": None}


def test_a_call_started_as_the_signal_was_sent_ran_twice_at_the_kill():
    """killed_at is read just before the signal: the killed worker may still start a call after it."""
    expected = {1: at(0)}
    starts = [(1, at(10.002)), (1, at(16))]

    out = _twice(expected, starts, killed_at=at(10).timestamp(), restarted_at=at(15).timestamp())

    assert out == {"duplicates_at_kill": 1, "duplicates_other": 0, "twice_started_before_kill_ms": -2.0}
