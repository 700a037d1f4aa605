"""Tasks due at one instant are found one row read each, also in a partition whose statistics are
older than the burst: PostgreSQL then rates the admin's (action_time) index as good as the primary
key for `action_time = x` and, given the choice, reads every task due at x to find one of them. A
burst of n tasks would cost n * n row reads in the claim and in the worker's start and DONE."""

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction

from tests.support.factories import cancel_all
from timeouts import registry
from timeouts.dispatch.claiming import claim_due
from timeouts.models import TimeoutTask
from timeouts.store import queries

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]
BURST = 1000


def burst_in_a_partition_with_stale_statistics(at) -> str:
    """BURST tasks due at `at`, in a partition last analyzed when the tasks in it were due one by
    one (and are cancelled now); returns the partition. One by one, a microsecond apart: spread
    over seconds, they would fall in the day before `at` during the first minutes of a day."""
    with connection.cursor() as cursor:  # no rows but this test's, dead or alive, in the partition's statistics
        cursor.execute("TRUNCATE timeouts_task")
    TimeoutTask.objects.bulk_schedule([{"biz_type": "test.record", "biz_id": f"spread-{i}",
                                        "at": at - timedelta(microseconds=i + 1)} for i in range(BURST)])
    cancel_all()  # only the burst is left to claim
    with connection.cursor() as cursor:
        cursor.execute("SELECT DISTINCT tableoid::regclass::text FROM timeouts_task")
        [partition] = [row[0] for row in cursor.fetchall()]
        cursor.execute(f"ANALYZE {partition}")
    TimeoutTask.objects.bulk_schedule([{"biz_type": "test.record", "biz_id": i, "at": at} for i in range(BURST)])
    return partition


def rows_removed(plan) -> int:
    """Rows a plan read and threw away, over all its nodes and loops."""
    if isinstance(plan, dict):
        removed = plan.get("Rows Removed by Filter", 0) * plan.get("Actual Loops", 1)
        return removed + sum(rows_removed(value) for value in plan.values())
    if isinstance(plan, list):
        return sum(rows_removed(value) for value in plan)
    return 0


def explain_analyze(sql, params):
    """EXPLAIN ANALYZE, rolled back."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
        plan = cursor.fetchone()[0]
        transaction.set_rollback(True)
    return plan


def test_the_claim_reads_each_claimed_task_once():
    # Due a second ago, so the whole burst is claimable.
    burst_in_a_partition_with_stale_statistics(datetime.now(UTC) - timedelta(seconds=1))
    params = {"limit": BURST // 2, "lead": 0.0, "max_dispatched": 10 * BURST, "shard_index": 0, "shard_count": 1,
              "attribute_prefixes": registry.attribute_prefixes()}
    plan = explain_analyze(queries.QUERIES["claim_due"], params)
    assert '"Actual Rows": 500' in json.dumps(plan)
    assert rows_removed(plan) < BURST // 10, json.dumps(plan, indent=1)
    assert len(claim_due(BURST, lead=0.0)) == BURST  # and the claim claims them all


def test_the_workers_start_and_done_find_each_task_by_its_primary_key():
    at = datetime.now(UTC).replace(microsecond=0) + timedelta(days=3)
    partition = burst_in_a_partition_with_stale_statistics(at)
    task, other = TimeoutTask.objects.filter(action_time=at).order_by("-job_id")[:2]
    params = {"job_id": task.job_id, "action_time": at, "attempt": 1, "lease_extra": 0.0, "ahead": 0.0,
              "done_job_id": other.job_id, "done_action_time": at, "done_attempt": 1,
              "worker_id": "w", "return_value": "null", "exception_class_path": "E", "traceback": "",
              "status": int(TimeoutTask.Status.DONE), "error": "", "started_at": at}
    for name in sorted(queries.ON_PARTITION):
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN (FORMAT JSON) " + queries.on_partition(name, partition), params)
            plan = json.dumps(cursor.fetchone()[0])
        updates = queries.QUERIES[name].count(queries.PARENT_UPDATE)  # finish_then_start_task: two
        assert plan.count(f'"Index Name": "{partition}_pkey"') == updates, (name, plan)

