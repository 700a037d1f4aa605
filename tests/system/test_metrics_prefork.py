"""Prometheus metrics of a real prefork Celery worker: the counts of its processes add up through
PROMETHEUS_MULTIPROC_DIR."""

import pytest
from django.db import connection
from django.test import override_settings
from django.urls import path
from prometheus_client.parser import text_string_to_metric_families

from tests.support import processes
from timeouts import metrics
from timeouts.models import TimeoutTask

Status = TimeoutTask.Status
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]
urlpatterns = [path("metrics/timeouts", metrics.metrics_view)]


def due(biz_type="test.record", biz_id=1):
    return TimeoutTask.objects.schedule(biz_type, biz_id, delay=-0.001)


@pytest.mark.slow
@pytest.mark.timeout(120)
@override_settings(ROOT_URLCONF=__name__)
def test_a_prefork_workers_counts_add_up_across_its_processes(client, broker, starts, tmp_path, monkeypatch):
    """Two prefork children run the scan and the handlers; the view, reading PROMETHEUS_MULTIPROC_DIR,
    sees the sum of what every child counted."""
    from project.celery import app

    env = processes.django_env(PROMETHEUS_MULTIPROC_DIR=tmp_path)
    with processes.running_worker(env=env, name="metrics-worker"):
        TimeoutTask.objects.bulk_schedule([{"biz_type": "test.record", "biz_id": i, "delay": -0.001}
                                           for i in range(8)])
        failing = due("test.fail")

        def settled():
            app.send_task("timeouts.scan")  # the scan, too, runs in a worker child
            with connection.cursor() as cursor:  # skip the retry's backoff
                cursor.execute("UPDATE timeouts_task SET run_at = action_time WHERE status = %s AND attempts > 0",
                               [Status.PENDING])
            done = TimeoutTask.objects.filter(status=Status.DONE).count()
            return done == 8 and TimeoutTask.objects.get(job_id=failing.job_id).status == Status.DEAD

        processes.wait_for(settled, timeout=60, interval=0.5, message="8 done and 1 dead")
        monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
        text = client.get("/metrics/timeouts").content.decode()
    samples = {(s.name, s.labels.get("biz_type")): s.value
               for family in text_string_to_metric_families(text) for s in family.samples if "le" not in s.labels}
    assert samples[("timeouts_dispatched_total", "test.record")] == 8
    assert samples[("timeouts_done_total", "test.record")] == 8
    assert samples[("timeouts_lateness_seconds_count", "test.record")] == 8
    assert samples[("timeouts_dispatched_total", "test.fail")] == 2
    assert samples[("timeouts_retried_total", "test.fail")] == 1
    assert samples[("timeouts_dead_total", "test.fail")] == 1
    assert ("timeouts_scheduled_total", "test.record") not in samples  # the test process counts in memory
    assert samples[("timeouts_pending_tasks", None)] == 0
    assert len(starts.all()) == 10
    pids = {path.name.split("_")[-1] for path in tmp_path.glob("counter_*.db")}
    assert pids, "no counter files were written"
