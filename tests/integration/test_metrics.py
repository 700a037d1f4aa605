"""Prometheus metrics: counters per biz_type counted once committed, the lateness histogram, gauges
read from the database, the view, and the counts of a real prefork worker's processes added up
through PROMETHEUS_MULTIPROC_DIR."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction
from django.test import override_settings
from django.urls import path
from prometheus_client.parser import text_string_to_metric_families

import timeouts
from tests.support.factories import move_to
from tests.support.isolation import no_limits  # noqa: F401  (a fixture)
from timeouts import events, metrics
from timeouts.dispatch.claiming import claim_due
from timeouts.models import TimeoutTask
from timeouts.store.recovery import recover_expired
from timeouts.worker import running

Status = TimeoutTask.Status
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]
urlpatterns = [path("metrics/timeouts", metrics.metrics_view)]


def value(name, biz_type="test.record", registry=None):
    return (registry or metrics.REGISTRY).get_sample_value(name, {"biz_type": biz_type}) or 0.0


class Deltas:
    """Counter values now minus at creation."""

    NAMES = [f"timeouts_{event}_total" for event in metrics.COUNTED] + ["timeouts_lateness_seconds_count"]

    def __init__(self, biz_type="test.record"):
        self.biz_type = biz_type
        self.start = {name: value(name, biz_type) for name in self.NAMES}

    def __call__(self):
        changed = {name.removeprefix("timeouts_").removesuffix("_total"): value(name, self.biz_type) - before
                   for name, before in self.start.items()}
        return {name: delta for name, delta in changed.items() if delta}


def due(biz_type="test.record", biz_id=1):
    return TimeoutTask.objects.schedule(biz_type, biz_id, delay=-0.001)


def run_claims():
    for claim in claim_due(100):
        running.run(claim.fence)


def scrape(client):
    response = client.get("/metrics/timeouts")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    return {sample.name: sample for family in text_string_to_metric_families(response.content.decode())
            for sample in family.samples if not sample.labels or sample.labels.get("biz_type") in (None, "test.record")}


def test_scheduling_and_cancelling_are_counted_once_committed():
    deltas = Deltas()
    task = TimeoutTask.objects.schedule("test.record", 1, delay=600)
    TimeoutTask.objects.bulk_schedule([{"biz_type": "test.record", "biz_id": i, "delay": 600, "on_conflict": None}
                                       for i in range(3)])  # 1 again: a second task of that key
    TimeoutTask.objects.schedule("test.record", 9, delay=600, on_conflict="replace")
    TimeoutTask.objects.schedule("test.record", 9, delay=600, on_conflict="replace")  # cancels the first
    TimeoutTask.objects.schedule("test.record", 9, delay=600, on_conflict="keep")  # nothing new
    with pytest.raises(RuntimeError), transaction.atomic():
        TimeoutTask.objects.schedule("test.record", 2, delay=600, on_conflict=None)
        TimeoutTask.objects.cancel("test.record", 1)
        raise RuntimeError("rolled back: neither counted")
    assert task.cancel() and not task.cancel()
    assert TimeoutTask.objects.cancel("test.record", 0) == 1
    assert deltas() == {"scheduled": 6, "cancelled": 3}


def test_dispatch_run_retry_dead_and_lateness(starts):  # starts: closes the test handler's connection
    record, fail = Deltas("test.record"), Deltas("test.fail")
    due("test.record")
    due("test.fail")
    run_claims()
    assert record() == {"dispatched": 1, "done": 1, "lateness_seconds_count": 1, "scheduled": 1}
    assert fail() == {"dispatched": 1, "retried": 1, "lateness_seconds_count": 1, "scheduled": 1}
    with connection.cursor() as cursor:  # skip the backoff
        cursor.execute("UPDATE timeouts_task SET run_at = action_time WHERE status = %s", [Status.PENDING])
    run_claims()
    assert fail() == {"dispatched": 2, "retried": 1, "dead": 1, "lateness_seconds_count": 1, "scheduled": 1}
    assert value("timeouts_lateness_seconds_bucket", "test.record") == 0  # sanity: buckets carry "le"
    assert metrics.REGISTRY.get_sample_value("timeouts_lateness_seconds_bucket",
                                             {"biz_type": "test.record", "le": "+Inf"}) >= 1


def test_lease_expiry_of_a_last_attempt_counts_as_dead():
    deltas = Deltas("test.fail")
    task = due("test.fail")
    # Its last attempt started, then its worker vanished: the lease ran out a second ago.
    move_to(task, Status.RUNNING, attempts=task.max_attempts, lease=timedelta(seconds=-1))
    assert recover_expired() == 1
    assert deltas() == {"scheduled": 1, "dead": 1}


def test_a_failing_receiver_never_breaks_the_caller(caplog):
    def broken(**kwargs):
        raise ValueError("receiver bug")

    events.task_event.connect(broken)
    try:
        task = TimeoutTask.objects.schedule("test.record", 1, delay=60)
    finally:
        events.task_event.disconnect(broken)
    assert task.job_id and "task_event receiver" in caplog.text


@override_settings(ROOT_URLCONF=__name__)
def test_the_view_shows_counters_and_gauges(client):
    TimeoutTask.objects.schedule("test.record", "old", at=datetime.now(UTC) - timedelta(minutes=5))
    TimeoutTask.objects.schedule("test.record", "later", delay=3600)
    TimeoutTask.objects.schedule("test.record", "far", at=datetime(2999, 1, 1, tzinfo=UTC))
    samples = scrape(client)
    assert samples["timeouts_pending_tasks"].value == 3
    assert samples["timeouts_overdue_tasks"].value == 1
    assert 290 < samples["timeouts_oldest_overdue_age_seconds"].value < 400
    assert samples["timeouts_default_partition_rows"].value == 1
    assert samples["timeouts_scheduled_total"].value >= 3


@override_settings(ROOT_URLCONF=__name__)
def test_the_view_says_what_to_install_without_prometheus_client(client, monkeypatch):
    monkeypatch.setattr(metrics, "prometheus_client", None)
    response = client.get("/metrics/timeouts")
    assert response.status_code == 501 and b"django-timeouts[prometheus]" in response.content


def test_late_starts_are_counted_by_biz_type_and_policy(starts, no_limits):  # noqa: F811
    def late_total(on_late):
        return metrics.REGISTRY.get_sample_value("timeouts_late_total",
                                                 {"biz_type": "test.record", "on_late": on_late}) or 0.0

    before = {on_late: late_total(on_late) for on_late in ("run", "skip", "dead")}
    deltas = Deltas()
    for on_late, biz_id in (("run", 1), ("skip", 2), ("dead", 3)):
        timeouts.set_limits("test.record", max_lateness=timedelta(seconds=1), on_late=on_late)
        TimeoutTask.objects.schedule("test.record", biz_id, at=datetime.now(UTC) - timedelta(seconds=10))
        run_claims()
    assert {on_late: late_total(on_late) - before[on_late] for on_late in before} == {"run": 1, "skip": 1, "dead": 1}
    assert deltas() == {"scheduled": 3, "dispatched": 3, "done": 1, "cancelled": 1, "dead": 1,
                        "lateness_seconds_count": 1}
