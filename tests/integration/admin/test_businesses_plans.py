"""The businesses page's SQL on partitioned, ANALYZEd data (the data of test_admin_plans.py: ~45,000
tasks over 30 daily partitions, and 20,000 more over the 24 hours around now, so the page's
windows hold many): every query it runs on the task table is served by indexes (no sequential scan
of a partition), pruned to the partitions it needs, and bounded: run with small row limits, no scan
returns or skips more rows than its limit allows, however many match.
"""

import json
from contextlib import nullcontext
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection

from benchmarks import admin_scenario
from tests.integration.admin.test_plans import captured_sql, explain, nodes, partitioned_data, scans, sequential
from timeouts import stats
from timeouts.models import TimeoutTask
from timeouts.stats import per_biz_type, time_buckets
from timeouts.store import clock
from timeouts.store.queries import QUERIES

Status = TimeoutTask.Status

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(120)]
URL = "/admin/timeouts/timeouttask/businesses/"
BIZ_TYPES = [name for name, _ in admin_scenario.BIZ_TYPES]
SMALL = 7  # row limits for the boundedness checks: far fewer than the data holds
__all__ = ["partitioned_data"]  # the module fixture, shared


# 12,000 tasks due over the two hours around now, one every 0.6 s, of the scenario's biz_types: past
# ones done (30% cancelled), 1.5 s late; future ones pending (25% cancelled); and 300 overdue ones.
DENSE_SQL = """
INSERT INTO timeouts_task (biz_type, biz_id, status, action_time, run_at, attempts, max_attempts, ttr, created_at,
                           modified_at, started_at, finished_at)
SELECT biz_type, 'dense-' || g, status, t, t, (status = %(done)s)::int, 16, 60, t - interval '1 h', t,
       CASE WHEN status = %(done)s THEN t + interval '1.5 s' END,
       CASE WHEN status IN (%(done)s, %(cancelled)s) THEN least(t + interval '2 s', %(now)s) END
FROM (SELECT g, t, {biz_type} AS biz_type,
             CASE WHEN t > %(now)s THEN (CASE WHEN g %% 4 = 0 THEN %(cancelled)s ELSE %(pending)s END)
                  ELSE (CASE WHEN g %% 10 < 3 THEN %(cancelled)s ELSE %(done)s END) END AS status
      FROM (SELECT g, %(now)s + (g - 6000) * interval '0.6 s' AS t FROM generate_series(0, 11999) AS g) AS times
     ) AS rows
"""


@pytest.fixture(scope="module")
def dense_data(partitioned_data, django_db_blocker):
    """DENSE_SQL's tasks on top of the partitioned data: the page's windows hold hundreds of each
    frequent biz_type. Removed with the rest."""
    statement = DENSE_SQL.replace("{biz_type}", admin_scenario._biz_type_case())
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        cursor.execute(statement, {"now": cursor.fetchone()[0], "done": Status.DONE, "cancelled": Status.CANCELLED,
                                   "pending": Status.PENDING})
        cursor.execute("INSERT INTO timeouts_task (biz_type, biz_id, status, action_time, run_at, max_attempts, ttr) "
                       "SELECT 'order.close', 'overdue-' || g, %s, now() - g * interval '1 s', "
                       "now() - g * interval '1 s', 16, 60 FROM generate_series(1, 300) AS g", [Status.PENDING])
        cursor.execute("ANALYZE timeouts_task")
    return partitioned_data


@pytest.fixture
def admin_client(client, dense_data):
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    return client


@pytest.fixture
def small_limits(monkeypatch):
    for module, name in ((per_biz_type, "OVERDUE_LIMIT"), (time_buckets, "PER_BIZ_TYPE_LIMIT"),
                         (per_biz_type, "RUNNING_LIMIT")):
        monkeypatch.setattr(module, name, SMALL)


def plan_of(name, params, analyze=False):
    """The plan of named query `name` with `params`, bound and planned as the page binds and plans them."""
    with as_the_page_plans(QUERIES[name]), connection.cursor() as cursor:
        options = "ANALYZE, BUFFERS, FORMAT JSON" if analyze else "FORMAT JSON"
        cursor.execute(f"EXPLAIN ({options}) " + QUERIES[name], params)
        document = cursor.fetchone()[0]
    return (json.loads(document) if isinstance(document, str) else document)[0]["Plan"]


def as_the_page_plans(sql):
    """The overdue counts run in stats.counting_in_index_order(); the rest as they come."""
    if sql.startswith(QUERIES["count_overdue_of_biz_type"].split("\n", 1)[0]):
        return stats.counting_in_index_order()
    return nullcontext()


def rows_touched(plan):
    """Rows every scan of a timeouts_task partition returned or threw away, over all its loops."""
    total = 0
    for node in nodes(plan):
        if node.get("Relation Name", "").startswith("timeouts_task_"):
            per_loop = (node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)
                        + node.get("Rows Removed by Index Recheck", 0))
            total += per_loop * node.get("Actual Loops", 1)
    return total


def params(name, biz_type="order.close", limit=SMALL):
    now = clock.database_now()
    return {
        "waiting_biz_types": {"limit": stats.BIZ_TYPES_LIMIT},
        "running_by_biz_type": {"limit": limit},
        "count_overdue_of_biz_type": {"now": now, "biz_type": biz_type, "limit": limit},
        "due_soon_of_biz_type": {"now": now, "biz_type": biz_type, "window": timedelta(hours=1), "bucket": 300.0,
                                 "limit": limit},
        "recent_lateness_of_biz_type": {"now": now, "biz_type": biz_type, "window": timedelta(minutes=15),
                                        "bucket": 60.0, "limit": limit},
    }[name]


PER_BIZ_TYPE = ("count_overdue_of_biz_type", "due_soon_of_biz_type", "recent_lateness_of_biz_type")
# query -> (index suffixes its scans may use, at most how many partitions it may read: 17 = the 15
# past days, today and DEFAULT, of 31; 18 with tomorrow). The lateness reads a frequent biz_type's
# tasks in time order off the action_time index, a rare one's off the biz_type index. The PENDING
# tasks' are read off timeouts_task_due_by_type (biz_type, run_at), or off timeouts_task_due (run_at)
# in partitions where few tasks wait (both partial: they only hold PENDING tasks).
CASES = {
    "waiting_biz_types": ({"biz_type_run_at_idx"}, None),
    "running_by_biz_type": ({"lease_until_idx"}, None),
    "count_overdue_of_biz_type": ({"biz_type_run_at_idx", "_run_at_idx"}, 17),
    "due_soon_of_biz_type": ({"biz_type_run_at_idx", "_run_at_idx"}, 18),
    "recent_lateness_of_biz_type": ({"biz_type_action_time_idx", "action_time_idx"}, 2),
}


@pytest.mark.parametrize("name,biz_type", [(name, biz_type) for name in CASES
                                           for biz_type in (BIZ_TYPES if name in PER_BIZ_TYPE else [None])])
def test_each_query_uses_indexes_and_prunes(dense_data, name, biz_type):
    allowed, most_partitions = CASES[name]
    found, _ = scans(plan_of(name, params(name, biz_type)))
    assert found and not sequential(found), found
    for _, partition, index in found:
        if partition != "timeouts_task_default":
            assert index and any(index.endswith(suffix) for suffix in allowed), (partition, index)
    if most_partitions is not None:
        assert len({partition for _, partition, _ in found}) <= most_partitions, found


@pytest.mark.parametrize("name,biz_type", [("count_overdue_of_biz_type", "order.close")] + [
    (name, biz_type) for name in PER_BIZ_TYPE[1:] for biz_type, share in admin_scenario.BIZ_TYPES if share >= 1000])
def test_each_query_stops_at_its_limit(dense_data, name, biz_type):
    """However many rows match, a query reads its limit's worth: `limit` of the biz_type's rows, and
    through an index that does not lead with biz_type (which PostgreSQL takes for a frequent one)
    the other biz_types' rows in between: about limit / its share in all."""
    share = dict(admin_scenario.BIZ_TYPES)[biz_type] / 10_000
    most = 2 * SMALL / share
    unbounded = rows_touched(plan_of(name, params(name, biz_type, limit=10**9), analyze=True))
    bounded = rows_touched(plan_of(name, params(name, biz_type), analyze=True))
    assert unbounded > most  # the data holds far more than the limit lets through
    assert bounded <= most, (bounded, SMALL, share)


def test_estimates_of_the_whole_table_are_of_every_partition(dense_data):
    """Not of the first partition of the Append: status_counts() samples rather than counts above
    a million rows, by this estimate."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM timeouts_task")
        rows = cursor.fetchone()[0]
    assert 0.5 * rows < stats.estimated_rows("table_rows") < 2 * rows


def test_the_biz_type_scan_probes_each_partition_once_per_biz_type(dense_data):
    plan = plan_of("waiting_biz_types", params("waiting_biz_types"), analyze=True)
    partitions = len({partition for _, partition, _ in scans(plan)[0]})
    # one probe per partition for each biz_type found, and one more that finds none after the last
    assert rows_touched(plan) <= (len(BIZ_TYPES) + 1) * partitions


def test_every_query_of_the_page_uses_indexes_and_is_bounded(admin_client, small_limits):
    response = admin_client.get(URL)
    shown = [row.biz_type for row in response.context["rows"]]
    assert set(BIZ_TYPES) <= set(shown)
    # the biz_types and the running tasks, then the overdue count, due soon and lateness of each
    # (and the planner's estimate of the overdue ones above the limit)
    sqls = [sql for sql in captured_sql(admin_client, URL) if not sql.startswith("EXPLAIN")]
    assert len(sqls) == 2 + 3 * len(shown), sqls
    for sql in sqls:
        with as_the_page_plans(sql):
            found, _ = scans(explain(sql))
        assert found and not sequential(found), (sql, found)
        with as_the_page_plans(sql), connection.cursor() as cursor:
            cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql)
            document = cursor.fetchone()[0]
        plan = (json.loads(document) if isinstance(document, str) else document)[0]["Plan"]
        if "WITH RECURSIVE" in sql:
            most = (stats.BIZ_TYPES_LIMIT + 1) * len({partition for _, partition, _ in found})
        else:
            most = 2 * SMALL / (min(share for _, share in admin_scenario.BIZ_TYPES if share >= 100) / 10_000)
        assert rows_touched(plan) <= most, (sql, rows_touched(plan), most)
