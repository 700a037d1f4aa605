"""Partition names and bounds: UTC-aligned buckets of each PARTITION_INTERVAL, their names, and the
bounds read back from a name (pure functions of timeouts.storage.partitions)."""

from datetime import UTC, datetime, timedelta, timezone

import pytest

from timeouts.storage import partitions


def at(text):
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


@pytest.mark.parametrize("interval, moment, start, following, name", [
    ("hour", "2026-11-21T13:45:10", "2026-11-21T13:00", "2026-11-21T14:00", "timeouts_task_h2026112113"),
    ("day", "2026-11-21T13:45:10", "2026-11-21T00:00", "2026-11-22T00:00", "timeouts_task_d20261121"),
    ("week", "2026-11-21T13:45:10", "2026-11-16T00:00", "2026-11-23T00:00", "timeouts_task_w20261116"),
    ("month", "2026-11-21T13:45:10", "2026-11-01T00:00", "2026-12-01T00:00", "timeouts_task_m202611"),
    ("month", "2031-12-31T23:59:59", "2031-12-01T00:00", "2032-01-01T00:00", "timeouts_task_m203112"),
    ("week", "2031-03-10T00:00:00", "2031-03-10T00:00", "2031-03-17T00:00", "timeouts_task_w20310310"),
])
def test_buckets_are_utc_aligned(interval, moment, start, following, name):
    begins = partitions.bucket_start(at(moment), interval)
    assert begins == at(start)
    assert partitions.next_bucket(begins, interval) == at(following)
    assert partitions.partition_name(begins, interval) == name
    assert partitions.bounds_from_name(name) == (at(start), at(following))
    # Another time zone names the same instant: same bucket.
    local = at(moment).astimezone(timezone(timedelta(hours=-5)))
    assert partitions.bucket_start(local, interval) == at(start)


def test_names_that_are_not_buckets_have_no_bounds():
    assert partitions.bounds_from_name("timeouts_task_default") is None
    assert partitions.bounds_from_name("timeouts_task_w20261117") is None  # a Tuesday
    assert partitions.bounds_from_name("timeouts_task_d20261321") is None
    assert partitions.bounds_from_name("timeouts_task_d2026112") is None
