"""A Celery worker whose pool process dies inside a `timeouts.run_batch` message: the batch is
delivered again and each of its tasks still runs at most once."""

import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from tests.support import processes
from timeouts.dispatch.claiming import claim_due
from timeouts.dispatch.publishing import publish
from timeouts.models import TimeoutTask

Status = TimeoutTask.Status
pytestmark = pytest.mark.django_db(transaction=True)


def schedule_due(biz_type, n, ago=5):
    """n tasks due `ago` seconds ago, a millisecond apart, oldest first."""
    now = datetime.now(UTC)
    return [TimeoutTask.objects.schedule(biz_type, f"{biz_type}-{i}", at=now - timedelta(seconds=ago) + timedelta(
        milliseconds=i)) for i in range(n)]


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_worker_that_dies_inside_a_batch_gets_it_again_and_runs_the_rest_once(broker, starts):
    """acks_late + reject_on_worker_lost: the batch is delivered again; the tasks that finished or
    started are dropped by their compare-and-set, the rest run. (The task whose process died waits
    out its lease, as a single message's would: see test_celery.)"""
    broker.flushdb()
    # One pool process, which exits right after its third compare-and-set; its replacement
    # counts from zero.
    env = processes.django_env(TIMEOUTS_FAULTS="run.after_start=exit#3")
    try:
        with processes.running_worker(env=env, name="worker-batch-crash", concurrency=1):
            tasks = schedule_due("test.record", 5)
            publish(claim_due(10))  # one timeouts.run_batch message (RUN_BATCH_SIZE is 20)
            # The third task's compare-and-set committed, then its process died before the handler.
            processes.wait_for(lambda: starts.count() >= 4, 60, message="the batch, delivered again, to finish")
            time.sleep(0.5)  # nothing more may start
            assert Counter(job_id for job_id, *_ in starts.all()) == Counter(t.job_id for t in tasks if t != tasks[2])
            statuses = [TimeoutTask.objects.get(pk=t.pk).status for t in tasks]
            assert statuses == [Status.DONE, Status.DONE, Status.RUNNING, Status.DONE, Status.DONE]
    finally:
        broker.flushdb()
