"""The admin's SQL on partitioned, ANALYZEd data: no COUNT(*) over the whole table, every list
query served by indexes (no sequential scan of a partition), and pruned to the partitions it needs.

The data: ~45,000 tasks over 30 daily partitions (15 days back, today, 14 ahead) with the status
and biz_type mix of the admin benchmark (benchmarks/admin_scenario.py), VACUUM ANALYZEd. The
module's fixture commits it once (the tests only read) and removes it at the end.
"""

import json
import re

import pytest
from django.contrib.auth.models import User
from django.db import connection, reset_queries
from django.test.utils import CaptureQueriesContext

from benchmarks import admin_scenario
from timeouts.models import TimeoutTask
from timeouts.storage import partitions

Status = TimeoutTask.Status
pytestmark = [pytest.mark.django_db, pytest.mark.timeout(120)]
URL = "/admin/timeouts/timeouttask/"
ROWS = 45_000


@pytest.fixture(scope="module")
def partitioned_data(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock():
        before = {p.name for p in partitions.list_partitions(connection)}
        admin_scenario.fill(connection, ROWS, rebuild_indexes=False, log=lambda message: None)
        with connection.cursor() as cursor:
            cursor.execute("SELECT job_id, biz_id FROM timeouts_task WHERE status = %s ORDER BY job_id LIMIT 1",
                           [Status.DEAD])
            dead = cursor.fetchone()
        yield {"partitions": len(partitions.list_partitions(connection)), "dead_job": dead[0], "dead_biz": dead[1]}
        with connection.cursor() as cursor:
            cursor.execute("TRUNCATE timeouts_task")
            for name in {p.name for p in partitions.list_partitions(connection)} - before:
                cursor.execute(f'DROP TABLE "{name}"')
            cursor.execute("ANALYZE timeouts_task")


@pytest.fixture
def admin_client(client, partitioned_data):
    client.force_login(User.objects.create_superuser("root", "root@example.com", "pw"))
    return client


def captured_sql(client, url):
    reset_queries()
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code == 200, url
    return [q["sql"] for q in queries.captured_queries if "timeouts_task" in q["sql"]]


def explain(sql):
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + sql)
        document = cursor.fetchone()[0]
    return (json.loads(document) if isinstance(document, str) else document)[0]["Plan"]


def nodes(plan):
    yield plan
    for child in plan.get("Plans", ()):
        yield from nodes(child)


def scans(plan):
    """(node type, partition, index) of every scan of a timeouts_task partition, and how many
    partitions were pruned at executor start-up."""
    found, removed = [], 0
    for node in nodes(plan):
        removed += node.get("Subplans Removed", 0)
        relation = node.get("Relation Name", "")
        if relation.startswith("timeouts_task_"):
            index = node.get("Index Name")
            if node["Node Type"] == "Bitmap Heap Scan":
                index = " + ".join(n["Index Name"] for n in nodes(node) if "Index Name" in n)
            found.append((node["Node Type"], relation, index))
    return found, removed


def sequential(found):
    """Sequential scans of range partitions. DEFAULT is left out: maintenance keeps it (nearly) empty,
    PostgreSQL reads an empty table without its indexes, and the metrics watch its size."""
    return [scan for scan in found if scan[0] == "Seq Scan" and scan[1] != "timeouts_task_default"]


def list_query(sqls):
    """The changelist's page query (the one with ORDER BY .. LIMIT)."""
    [sql] = [s for s in sqls if "ORDER BY" in s and not s.startswith("EXPLAIN") and "count(" not in s.lower()]
    return sql


def assert_no_full_count(sqls):
    for sql in sqls:
        lowered = sql.lower()
        if "count(" in lowered and not lowered.startswith("explain"):
            assert re.search(r"limit \d+\) as bounded", lowered), f"unbounded count: {sql}"
    assert not any('COUNT(*) AS "__count"' in sql for sql in sqls)


# url params -> (index suffixes the page query must use, at most how many partitions it may read:
# 17 = the 15 past days, today and DEFAULT, of 31)
CASES = {
    "": ({"action_time_idx"}, None),
    "o=5": ({"action_time_idx"}, None),
    "p=3": ({"action_time_idx"}, None),
    f"status={Status.PENDING:d}": ({"status_action_time_idx"}, None),
    f"status={Status.PENDING:d}&o=5": ({"status_action_time_idx"}, None),
    f"status={Status.DISPATCHED:d}": ({"lease_until_idx"}, None),
    f"status={Status.RUNNING:d}": ({"lease_until_idx"}, 17),
    f"status={Status.DONE:d}": ({"action_time_idx"}, 17),
    f"status={Status.CANCELLED:d}": ({"status_action_time_idx"}, None),
    f"status={Status.DEAD:d}": ({"status_action_time_idx"}, 17),
    "biz_type=order.close": ({"biz_type_action_time_idx"}, None),
    "biz_type=audit.rare": ({"biz_type_action_time_idx"}, None),
    "due=overdue": ({"run_at_idx", "status_action_time_idx"}, 17),
    "due=next_hour": ({"action_time_idx"}, 2),
    "due=today": ({"action_time_idx"}, 1),
    f"status={Status.DEAD:d}&biz_type=order.close": ({"status_action_time_idx", "biz_type_action_time_idx"}, 17),
    # timeouts_task_ended_late, whose partitions' indexes are named after the same columns
    "late=skip": ({"status_action_time_idx1"}, 17),
    "late=dead": ({"status_action_time_idx1"}, 17),
}


def test_the_data_spans_many_partitions(partitioned_data):
    assert partitioned_data["partitions"] >= 31  # 30 days and DEFAULT
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(DISTINCT tableoid) FROM timeouts_task")
        assert cursor.fetchone()[0] >= 30


@pytest.mark.parametrize("params", list(CASES))
def test_changelist_queries_use_indexes_and_prune(admin_client, params):
    wanted, most_partitions = CASES[params]
    sqls = captured_sql(admin_client, f"{URL}?{params}")
    assert_no_full_count(sqls)
    found, removed = scans(explain(list_query(sqls)))
    assert found, "the page query reads no partition"
    assert not sequential(found), found
    used = {index for _, _, index in found if index}
    assert any(index.endswith(suffix) for index in used for suffix in wanted), (wanted, used)
    read = {partition for _, partition, _ in found}
    if most_partitions is not None:
        assert len(read) <= most_partitions, (len(read), removed, read)
        assert "timeouts_task_default" not in read or most_partitions > 2


def test_every_count_is_bounded_or_estimated(admin_client):
    for params in CASES:
        assert_no_full_count(captured_sql(admin_client, f"{URL}?{params}"))


def test_search_and_detail_probe_indexes(admin_client, partitioned_data):
    for url in (f"{URL}?q={partitioned_data['dead_job']}", f"{URL}?q={partitioned_data['dead_biz']}",
                f"{URL}{partitioned_data['dead_job']}/change/"):
        sqls = captured_sql(admin_client, url)
        assert_no_full_count(sqls)
        for sql in sqls:
            if sql.lower().startswith(("explain", "select count(")):
                continue
            found, _ = scans(explain(sql))
            assert found and not sequential(found), (url, found)
            for _, partition, index in found:
                if partition != "timeouts_task_default":
                    assert set(index.split(" + ")) <= {f"{partition}_pkey", f"{partition}_biz_id_biz_type_idx"}


def test_estimated_counts_need_no_scan(admin_client):
    """Above the exact limit, the number shown comes from the planner (the statistics)."""
    response = admin_client.get(URL)
    cl = response.context["cl"]
    assert not cl.paginator.count_is_exact
    assert 0.5 * ROWS < cl.result_count < 2 * ROWS
