"""The Hypothesis strategies of tests/support/input_strategies.py: the input properties
(tests/integration/test_validation.py) are only as good as their inputs, so the edge values
must be in the strategies."""

import math
from collections import Counter

from hypothesis import HealthCheck, given, settings

from tests.support.input_strategies import Arg, any_of
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
