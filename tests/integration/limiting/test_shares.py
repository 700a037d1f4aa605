"""Limits across three shards: each shard claims only its part of a biz_type's limits, so that the
shards together stay within them; the parts start even and follow the due tasks once the scan has
shared them out, never lowering a shard's part below what it runs, never adding up to more than the
whole."""

import io
import json
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import call_command
from django.db import connections

import timeouts
from tests.support.shards import ALIASES, key_on, three_shards  # noqa: F401 (an autouse fixture)
from timeouts.dispatch.claiming import claim_due
from timeouts.limiting import shares
from timeouts.models import TimeoutTask
from timeouts.storage import resharding
from timeouts.store import worker_connection

Status = TimeoutTask.Status
pytestmark = [pytest.mark.django_db(transaction=True, databases=ALIASES), pytest.mark.timeout(120)]
BIZ_TYPE = "test.record"


def due_on(alias, n, prefix="due"):
    """`n` tasks of BIZ_TYPE due a minute ago, on `alias`."""
    keys, count = [], 0
    while len(keys) < n:
        key = key_on(alias, prefix=f"{prefix}-{count}", biz_type=BIZ_TYPE)
        count += 1
        if key not in keys:
            keys.append(key)
    at = datetime.now(UTC) - timedelta(minutes=1)
    TimeoutTask.objects.bulk_schedule([{"biz_type": BIZ_TYPE, "biz_id": key, "at": at} for key in keys])


def claimed_on(alias, n=100):
    with worker_connection.shared(alias):
        return len(claim_due(n))


def finish_all(alias):
    """What the workers would do with the shard's claimed tasks: run them (DONE)."""
    with connections[alias].cursor() as cursor:
        cursor.execute("UPDATE timeouts_task SET status = %s, lease_until = NULL, started_at = now(), "
                       "finished_at = now(), attempts = attempts + 1 WHERE status = %s",
                       [Status.DONE, Status.DISPATCHED])


def parts():
    """Each shard's (rate part, concurrency part) of BIZ_TYPE's limits, as stored (None: even)."""
    found = []
    for alias in ALIASES:
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT rate_share, concurrency_share FROM timeouts_limits WHERE biz_type = %s",
                           [BIZ_TYPE])
            found.append(cursor.fetchone())
    return found


def concurrency_tasks():
    """Each shard's part of BIZ_TYPE's concurrency, in tasks, as its claims read it."""
    found = []
    for index, alias in enumerate(ALIASES):
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT timeouts_concurrency_part(concurrency_in_force, concurrency_share, %s, %s) "
                           "FROM timeouts_limits WHERE biz_type = %s", [index, len(ALIASES), BIZ_TYPE])
            found.append(cursor.fetchone()[0])
    return found


def test_before_the_limits_are_shared_out_each_shard_claims_an_even_part():
    timeouts.set_limits(BIZ_TYPE, concurrency=4)
    for alias in ALIASES:
        due_on(alias, 5)
    # 4 tasks over 3 shards: 1, 1 and 2, as timeouts_concurrency_part() splits them.
    assert [claimed_on(alias) for alias in ALIASES] == [1, 1, 2]


def test_a_limit_smaller_than_the_number_of_shards_is_never_exceeded():
    timeouts.set_limits(BIZ_TYPE, concurrency=1)
    for alias in ALIASES:
        due_on(alias, 3)
    assert sum(claimed_on(alias) for alias in ALIASES) == 1


def test_the_parts_follow_the_due_tasks_once_shared_out():
    timeouts.set_limits(BIZ_TYPE, rate_limit=300, concurrency=4)
    due_on("shard_b", 10)
    assert shares.share_limits() > 0
    rate_parts, concurrency_parts = zip(*parts(), strict=True)
    # The rate: a tenth evenly, the rest where the tasks are; the concurrency: all where they are.
    assert rate_parts == pytest.approx([0.1 / 3, 0.1 / 3 + 0.9, 0.1 / 3])
    assert [round(part * 4) for part in concurrency_parts] == [0, 4, 0]
    due_on("default", 2)
    assert [claimed_on(alias) for alias in ALIASES] == [0, 4, 0]
    shares.share_limits()  # shard_b runs all four: the others still get none
    assert [round(part * 4) for _, part in parts()] == [0, 4, 0]


def test_a_part_is_never_lowered_below_what_its_shard_runs():
    timeouts.set_limits(BIZ_TYPE, concurrency=4)
    due_on("shard_b", 6)
    shares.share_limits()
    assert claimed_on("shard_b") == 4
    due_on("shard_c", 6)
    shares.share_limits()
    # shard_b still runs its 4: shard_c may start none yet.
    assert [round(part * 4) for _, part in parts()] == [0, 4, 0]
    assert claimed_on("shard_c") == 0
    finish_all("shard_b")
    shares.share_limits()
    # Due on both now (2 left on shard_b, 6 on shard_c): the four go where the tasks are.
    assert sum(round(part * 4) for _, part in parts()) == 4
    assert claimed_on("shard_b") + claimed_on("shard_c") == 4


def test_the_parts_never_add_up_to_more_than_the_whole():
    timeouts.set_limits(BIZ_TYPE, rate_limit=50, concurrency=7)
    for rounds, counts in enumerate([(9, 0, 0), (0, 3, 8), (1, 1, 1), (0, 0, 0), (20, 20, 1)]):
        for alias, n in zip(ALIASES, counts, strict=True):
            due_on(alias, n, prefix=f"round-{rounds}")
        shares.share_limits()
        rate_parts, _ = zip(*parts(), strict=True)
        assert sum(rate_parts) <= 1 + 1e-9
        assert sum(concurrency_tasks()) <= 7
        for alias in ALIASES:
            claimed_on(alias)
        in_flight = sum(TimeoutTask.objects.using(alias).filter(status=Status.DISPATCHED).count() for alias in ALIASES)
        assert in_flight <= 7
        for alias in ALIASES[rounds % 3:]:
            finish_all(alias)


def test_a_new_limit_is_shared_as_the_old_one_was():
    timeouts.set_limits(BIZ_TYPE, concurrency=4)
    due_on("shard_c", 6)
    shares.share_limits()
    timeouts.set_limits(BIZ_TYPE, concurrency=2)  # an incident: fewer at once, on every shard at once
    assert [claimed_on(alias) for alias in ALIASES] == [0, 0, 2]


def test_limits_that_differ_between_shards_are_left_as_they_are_until_they_agree():
    timeouts.set_limits(BIZ_TYPE, concurrency=4)
    timeouts.set_limits(BIZ_TYPE, concurrency=6, using="shard_b")
    due_on("shard_b", 6)
    assert shares.share_limits() == 0
    assert parts() == [(None, None)] * 3


def test_one_sharing_at_a_time():
    timeouts.set_limits(BIZ_TYPE, concurrency=4)
    due_on("shard_b", 6)
    held = connections.create_connection("default")  # another scan's session, holding the lock
    lock = [shares.LOCK_NAMESPACE, shares.LOCK_KEY]
    try:
        with held.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_lock(%s, %s)", lock)
            assert shares.share_limits() == 0
            cursor.execute("SELECT pg_advisory_unlock(%s, %s)", lock)
    finally:
        held.close()
    assert shares.share_limits() > 0


def test_a_new_number_of_shards_starts_from_even_parts():
    timeouts.set_limits(BIZ_TYPE, rate_limit=10, concurrency=4)
    due_on("shard_b", 6)
    shares.share_limits()
    resharding.clear_limit_shares(ALIASES)
    assert parts() == [(None, None)] * 3


def test_with_one_shard_the_whole_limit_is_claimed(settings):
    settings.TIMEOUTS = {**settings.TIMEOUTS, "SHARDS": ["default"]}
    timeouts.set_limits(BIZ_TYPE, concurrency=4)
    due_on("default", 6)
    assert shares.share_limits() == 0
    assert claimed_on("default") == 4


def test_each_shards_report_shows_its_part_and_the_totals_the_whole():
    timeouts.set_limits(BIZ_TYPE, rate_limit=300, concurrency=4)
    due_on("shard_b", 10)
    shares.share_limits()
    out = io.StringIO()
    call_command("timeouts_stats", "--json", "--database", "shard_b", stdout=out)
    [row] = [row for row in json.loads(out.getvalue())["biz_types"] if row["biz_type"] == BIZ_TYPE]
    assert (row["rate_limit"], row["concurrency"]) == (300, 4)
    assert (row["rate_part"], row["concurrency_part"]) == (pytest.approx(300 * (0.1 / 3 + 0.9)), 4)
    out = io.StringIO()
    call_command("timeouts_stats", "--database", "shard_c", stdout=out)
    assert "(this shard's part: rate_limit 10/s, concurrency 0)" in out.getvalue()
    out = io.StringIO()
    call_command("timeouts_stats", "--json", stdout=out)
    [row] = [row for row in json.loads(out.getvalue())["biz_types"] if row["biz_type"] == BIZ_TYPE]
    assert (row["rate_limit"], row["concurrency"], row["rate_part"], row["concurrency_part"]) == (300, 4, None, None)
