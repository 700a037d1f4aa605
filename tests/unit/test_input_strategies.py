"""The Hypothesis strategies of tests/support/input_strategies.py: the input properties
(tests/integration/test_validation.py) are only as good as their inputs, so the edge values
must be in the strategies."""

import math
from collections import Counter
from datetime import timedelta

from hypothesis import HealthCheck, given, settings

from tests.support.input_strategies import YEAR, Arg, any_of
from timeouts import InvalidOption
from timeouts.conf import get_settings


def test_the_strategies_reach_both_sides_of_each_limit():
    limit = get_settings().MAX_ATTRIBUTE_BYTES
    found = Counter()

    # derandomize: a fixed sequence of examples, so this check of the strategies cannot fail by
    # chance (random examples miss a kind now and then).
    @settings(max_examples=300, database=None, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(attribute=any_of("attribute"))
    def collect(attribute: Arg):
        found[attribute.label.split(" ")[0] + ("-ok" if attribute.error is None else "-bad")] += 1

    collect()
    for kind in ("size-ok", "size-bad", "deep-ok", "deep-bad", "leaf-bad", "key-bad", "json-ok"):
        assert found[kind], (kind, dict(found), limit)
    assert math.isfinite(limit)



MODES = (None, "error", "replace", "keep", "debounce")  # docs: reference/api


def conflict_kind(keywords) -> str:
    """What the API makes of on_conflict= and max_wait= (docs: reference/api), told without the
    strategies' own words: a kind ending in "-bad" raises InvalidOption."""
    on_conflict = keywords.get("on_conflict", "error")
    max_wait = keywords.get("max_wait")
    if on_conflict not in MODES:
        return "on_conflict-bad"
    if on_conflict != "debounce":
        return "other-mode" if max_wait is None else "max_wait-without-debounce-bad"
    if max_wait is None:
        return "debounce-no-cap"
    if not isinstance(max_wait, timedelta):
        return "max_wait-not-a-timedelta-bad"
    if max_wait < timedelta(0):
        return "max_wait-negative-bad"
    if max_wait == timedelta(0):
        return "max_wait-zero"
    return "max_wait-huge" if max_wait > 10_000 * YEAR else "max_wait"  # more than any time can be from another


def test_the_conflict_strategies_reach_every_kind_of_max_wait_and_say_what_the_api_raises():
    found = Counter()

    @settings(max_examples=300, database=None, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.too_slow])
    @given(conflict=any_of("conflict"))
    def collect(conflict: Arg):
        kind = conflict_kind(conflict.value)
        found[kind] += 1
        assert conflict.error is (InvalidOption if kind.endswith("-bad") else None), (kind, conflict)

    collect()
    for kind in ("on_conflict-bad", "other-mode", "max_wait-without-debounce-bad", "debounce-no-cap",
                 "max_wait-not-a-timedelta-bad", "max_wait-negative-bad", "max_wait-zero", "max_wait-huge", "max_wait"):
        assert found[kind], (kind, dict(found))
