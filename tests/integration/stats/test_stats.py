"""timeouts.stats and `manage.py timeouts_stats`: exact counts for small sets, estimates (never a
full scan) for large ones, the oldest overdue task, DEFAULT rows, lateness percentiles, partitions."""

import io
import json
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import call_command
from django.db import connection

from tests.support.factories import move_to
from timeouts import stats
from timeouts.models import TimeoutTask
from timeouts.stats import whole_table

Status = TimeoutTask.Status
pytestmark = [pytest.mark.django_db, pytest.mark.timeout(60)]


def now():
    return datetime.now(UTC)


def test_count_is_exact_below_the_limit_and_estimated_above():
    TimeoutTask.objects.bulk_schedule([{"biz_type": "test.record", "biz_id": i, "delay": 600} for i in range(30)])
    everything = TimeoutTask.objects.all()
    assert stats.count(everything) == stats.Count(30, True)
    estimated = stats.count(everything, exact_limit=10)
    assert not estimated.exact and estimated.value >= 11  # never below what was counted
    assert stats.count(everything.none()) == stats.Count(0, True)
    assert str(stats.Count(1234, False)) == "~1,234" and str(stats.Count(5, True)) == "5"


def test_count_skips_counting_when_the_planner_says_it_is_expensive():
    TimeoutTask.objects.bulk_schedule([{"biz_type": "test.record", "biz_id": i, "delay": 600} for i in range(5)])
    counted = stats.count(TimeoutTask.objects.all(), max_cost=0.0)
    assert not counted.exact


def test_oldest_overdue_pending_and_default_rows():
    assert stats.oldest_overdue() is None
    assert stats.overdue() == stats.Count(0, True)
    old = TimeoutTask.objects.schedule("test.record", "old", at=now() - timedelta(minutes=10))
    TimeoutTask.objects.schedule("test.record", "new", at=now() - timedelta(minutes=1))
    TimeoutTask.objects.schedule("test.record", "later", delay=3600)
    far = TimeoutTask.objects.schedule("test.record", "far", at=datetime(2999, 1, 1, tzinfo=UTC))
    oldest = stats.oldest_overdue()
    assert oldest["job_id"] == old.job_id and oldest["biz_id"] == "old"
    assert timedelta(minutes=9) < oldest["age"] < timedelta(minutes=11)
    assert stats.overdue() == stats.Count(2, True)
    assert stats.pending() == stats.Count(4, True)
    assert stats.pending(limit=2).exact is False
    # "far" lies beyond every partition; so does "old" in the first ten minutes of a day, when its
    # bucket (yesterday's) is older than the test database's partitions.
    with connection.cursor() as cursor:
        cursor.execute("SELECT tableoid::regclass::text FROM timeouts_task WHERE job_id = %s", [old.job_id])
        old_in_default = cursor.fetchone()[0] == "timeouts_task_default"
    assert stats.default_rows() == stats.Count(1 + old_in_default, True)
    assert far.action_time.year == 2999


def test_status_counts_exact_and_sampled(monkeypatch):
    tasks = [TimeoutTask.objects.schedule("test.record", i, at=now() - timedelta(seconds=30)) for i in range(4)]
    TimeoutTask.objects.schedule("test.fail", 9, delay=600)
    move_to(tasks[0], Status.DONE, started_after=0.5)
    move_to(tasks[1], Status.RUNNING, started_after=0.5)
    counts, how = stats.status_counts()
    assert how == "exact"
    assert counts == {(Status.PENDING, "test.record"): stats.Count(2, True),
                      (Status.PENDING, "test.fail"): stats.Count(1, True),
                      (Status.DONE, "test.record"): stats.Count(1, True),
                      (Status.RUNNING, "test.record"): stats.Count(1, True)}
    # Large tables are sampled; the small indexed groups (here RUNNING) are still counted exactly.
    monkeypatch.setattr(whole_table, "EXACT_TABLE_ROWS", 0)
    monkeypatch.setattr(whole_table, "SAMPLE_ROWS", 10**9)  # a 100% sample: deterministic
    sampled, how = stats.status_counts()
    assert how.startswith("estimated from a 100% sample")
    assert sampled[(Status.RUNNING, "test.record")] == stats.Count(1, True)
    assert sampled[(Status.PENDING, "test.record")] == stats.Count(2, False)
    exact, how = stats.status_counts(exact=True)
    assert how == "exact" and exact == counts


def test_lateness_percentiles_of_recent_first_attempts():
    tasks = [TimeoutTask.objects.schedule("test.record", i, at=now() - timedelta(minutes=2)) for i in range(5)]
    for task, late in zip(tasks[:4], (0.1, 0.2, 0.3, 10.0), strict=True):
        move_to(task, Status.DONE, started_after=late)
    TimeoutTask.objects.schedule("test.record", "old", at=now() - timedelta(hours=2))  # outside the window
    late = stats.lateness(minutes=15)
    assert (late["due"], late["started"], late["waiting"]) == (5, 4, 1)
    assert late["p50"] == pytest.approx(0.25) and late["max"] == pytest.approx(10.0)
    assert 0.3 < late["p90"] < 10.0


def test_partition_sizes_list_every_partition():
    sizes = stats.partition_sizes()
    assert sum(p["default"] for p in sizes) == 1
    assert all(p["bytes"] > 0 for p in sizes) and len(sizes) >= 15


def test_command_text_and_json():
    task = TimeoutTask.objects.schedule("test.record", "late-one", at=now() - timedelta(minutes=3))
    out = io.StringIO()
    call_command("timeouts_stats", stdout=out)
    text = out.getvalue()
    assert "Tasks by status and biz_type (exact):" in text
    assert "pending    test.record" in text
    assert f"Oldest overdue task: job {task.job_id} test.record:late-one" in text
    assert "Rows in the DEFAULT partition: 0" in text
    assert "timeouts_task_default" in text and "Lateness of tasks due in the last 15 min" in text
    out = io.StringIO()
    call_command("timeouts_stats", "--json", "--exact", "--minutes", "5", stdout=out)
    data = json.loads(out.getvalue())
    assert data["counts"]["rows"] == [{"status": "pending", "biz_type": "test.record", "count": 1, "exact": True}]
    assert data["oldest_overdue"]["job_id"] == task.job_id and data["lateness"]["minutes"] == 5
    assert data["default_partition"] == {"rows": 0, "exact": True}
