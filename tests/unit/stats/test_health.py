"""The parts of the health check that need no database: how far partitions cover time (gaps, a
change of PARTITION_INTERVAL, MAXVALUE), the thresholds and their defaults, and the bounded
connection's settings."""

from datetime import UTC, datetime

import pytest

from timeouts.stats import bounded_reads, health


def day(n):
    return datetime(2026, 11, n, tzinfo=UTC)


def test_partitions_cover_time_up_to_their_first_gap():
    days = [(day(1), day(2)), (day(2), day(3)), (day(4), day(5))]
    assert health._covered_until(day(1), days) == day(3)
    assert health._covered_until(day(3), days) == day(3)  # not covered at all
    assert health._covered_until(day(4), list(reversed(days))) == day(5)


def test_a_run_of_partitions_of_another_interval_covers_a_bucket():
    # PARTITION_INTERVAL went from "month" to "day": November's partition holds every day of it.
    month_then_days = [(day(1), datetime(2026, 12, 1, tzinfo=UTC)),
                       (datetime(2026, 12, 1, tzinfo=UTC), datetime(2026, 12, 2, tzinfo=UTC))]
    assert health._covered_until(day(20), month_then_days) == datetime(2026, 12, 2, tzinfo=UTC)
    assert health._covered_until(day(20), [(None, None)]) == datetime.max.replace(tzinfo=UTC)
    assert health._covered_until(day(20), [(None, day(21))]) == day(21)


def test_thresholds_are_checked():
    assert health.Thresholds(60, 30, 0).timeout == health.DEFAULT_TIMEOUT
    for bad in ({"max_lateness": 0}, {"max_claim_gap": -1}, {"timeout": float("nan")}, {"timeout": float("inf")},
                {"partitions_ahead": -1}, {"partitions_ahead": 1.5}, {"max_lateness": True}):
        with pytest.raises(ValueError):
            health.Thresholds(**{"max_lateness": 60, "max_claim_gap": 30, "partitions_ahead": 1, **bad})


def test_unknown_checks_are_refused():
    with pytest.raises(ValueError, match="checks must be some of read, lateness, claims, partitions"):
        health.check(checks=("lateness", "mood"))


def test_the_bounded_connection_keeps_the_host_s_options_and_drops_a_pool():
    entry = {"NAME": "x", "OPTIONS": {"options": "-c search_path=app", "connect_timeout": 1, "pool": True}}
    bounded = bounded_reads.bounded_settings(entry, 7.5)
    assert bounded["OPTIONS"] == {"options": "-c search_path=app -c statement_timeout=7500", "connect_timeout": 1}
    assert entry["OPTIONS"]["pool"] is True  # the host's entry is left as it was
    assert bounded_reads.bounded_settings({"NAME": "x"}, 0.5)["OPTIONS"] == {
        "connect_timeout": 2, "options": "-c statement_timeout=500"}
