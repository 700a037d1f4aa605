"""TimeoutsBackend end to end: Django's tasks run in real Celery worker processes (prefork), through
the real broker and PostgreSQL, handed over by a real dispatcher process or by the safety scan
(run in a thread of the test process, as beat would run it). The conformance checklist that the
in-process tests (tests/integration/backends/test_backend.py) do not cover: run_after order and
lateness, workers' signals and results, a worker killed mid-task, cancels racing the due time,
and the Celery queue of each queue name."""

import json
import os
import random
import signal
import statistics
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from tests.support import processes
from tests.support.broker_messages import queue_length
from tests.system.test_dispatcher import dispatcher_process
from tests.testapp import django_tasks as tasks
from timeouts.backends import LeaseExpired, cancel
from timeouts.backends.compat import TaskResultStatus
from timeouts.dispatch.scan import scan
from timeouts.models import TimeoutTask

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
Status = TimeoutTask.Status
ON_TIME = 1.0  # seconds: the most a start may lag its run_after here (a shared, noisy machine)


@pytest.fixture(autouse=True)
def tables(transactional_db):
    with connection.cursor() as cursor:
        cursor.execute(tasks.RUNS_TABLE_SQL)
        cursor.execute(tasks.SIGNALS_TABLE_SQL)
        cursor.execute("TRUNCATE timeouts_test_django_task, timeouts_test_django_signal")
    yield
    tasks.close()


def runs():
    """(result_id, label, attempt, pid, started_at) of every start, in start order."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT result_id, label, attempt, pid, started_at FROM timeouts_test_django_task "
                       "ORDER BY started_at")
        # Django reads jsonb as text.
        return [(result_id, json.loads(label), *rest) for result_id, label, *rest in cursor.fetchall()]


def settled():
    return not TimeoutTask.objects.filter(
        biz_type__startswith="tasks:", status__in=[Status.PENDING, Status.DISPATCHED, Status.RUNNING]).exists()


@pytest.fixture
def one_process_worker(transactional_db, broker):
    """A worker of one pool process: its starts follow one another, so their order is the order
    in which the tasks were handed over (two processes may overtake each other on a loaded machine)."""
    broker.flushdb()
    with processes.running_worker(env=processes.django_env(), name="tasks-backend-worker", concurrency=1) as process:
        yield process


@pytest.mark.timeout(90)
def test_tasks_start_in_workers_at_their_run_after_in_order_and_report_back(one_process_worker):
    order = list(range(20))
    random.shuffle(order)  # enqueued in any order: they start in run_after order
    with dispatcher_process():
        first = datetime.now(UTC) + timedelta(seconds=1.5)  # once the dispatcher is up: it may take a while
        due = [first + timedelta(milliseconds=100 * i) for i in range(20)]
        results = {i: tasks.record.using(run_after=due[i]).enqueue(i) for i in order}
        added = tasks.async_add.enqueue(20, 22)
        failed = tasks.fail.enqueue("in a worker")
        processes.wait_for(settled, 60, message="every task to finish")
    started = runs()
    assert len({result_id for result_id, *_ in started}) == len(started) == 21  # each once
    # In run_after order, by the compare-and-set that started each (the database clock).
    for result in results.values():
        result.refresh()
    assert sorted(range(20), key=lambda i: results[i].started_at) == list(range(20))
    lateness = [(started_at - due[label]).total_seconds() for _, label, _, _, started_at in started
                if label != "in a worker"]
    print(f"lateness of the function's start: median {statistics.median(lateness) * 1000:.1f} ms, "
          f"max {max(lateness) * 1000:.1f} ms")
    assert 0 <= min(lateness) and max(lateness) < ON_TIME
    assert all(pid != os.getpid() for *_, pid, _ in started)
    fenced = [(results[i].started_at - due[i]).total_seconds() for i in range(20)]
    print(f"lateness of the compare-and-set: median {statistics.median(fenced) * 1000:.1f} ms, "
          f"max {max(fenced) * 1000:.1f} ms")
    assert 0 <= min(fenced) and max(fenced) < ON_TIME

    for i, result in results.items():
        assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value["label"] == i
        assert result.attempts == 1 and result.worker_ids[0].startswith("tasks-backend-worker@")
        assert result.return_value["worker_ids"] == result.worker_ids
    assert tasks.async_add.get_result(added.id).return_value == 42
    failed.refresh()
    assert failed.status == TaskResultStatus.FAILED and failed.errors[0].exception_class is ValueError
    with connection.cursor() as cursor:
        cursor.execute("SELECT signal, status, pid FROM timeouts_test_django_signal WHERE result_id = %s "
                       "ORDER BY sent_at", [failed.id])
        signals = cursor.fetchall()
    assert [(name, status) for name, status, _ in signals] == [
        ("enqueued", "READY"), ("started", "RUNNING"), ("finished", "FAILED")]
    assert signals[0][2] == os.getpid() and signals[1][2] == signals[2][2] != os.getpid()  # sent by the worker


@pytest.mark.timeout(90)
def test_a_worker_killed_mid_task_is_retried_never_left_running(worker):
    # "retrying": three attempts and a TTR of 3 s; the task sleeps on its first attempt only.
    result = tasks.sleep.using(backend="retrying").enqueue(30, attempts=1)
    with processes.scanning(0.05):
        processes.wait_for(lambda: runs(), 30, message="the first attempt to start")
        [(_, _, attempt, pid, _)] = runs()
        os.kill(pid, signal.SIGKILL)
        processes.wait_for(lambda: tasks.sleep.using(backend="retrying").get_result(result.id).is_finished, 45,
                           message="the task to finish after its lease ran out")
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 2
    assert result.attempts == 2 and len(result.worker_ids) == 2
    [lost] = result.errors
    assert lost.exception_class is LeaseExpired and "lease" in lost.traceback
    assert [attempt for _, _, attempt, _, _ in runs()] == [1, 2]


@pytest.mark.timeout(120)
def test_a_true_cancel_racing_the_due_time_never_runs(worker):
    first = datetime.now(UTC) + timedelta(seconds=2)
    due = [first + timedelta(milliseconds=20 * i) for i in range(120)]
    results = [tasks.record.using(run_after=at).enqueue(i) for i, at in enumerate(due)]
    cancelled = set()
    with processes.scanning(0.005):
        # Every other task, just before, at or after its due time: while it is claimed, published,
        # started; and well after it, so that some cancels lose however slow the machine is. In the
        # order of those moments, so one cancel's wait does not delay the next.
        offsets = [-0.03, -0.01, 0.0, 0.005, 0.01, 0.03, 0.1, 0.5, 1.5]
        moments = sorted((due[i] + timedelta(seconds=offsets[n % len(offsets)]), i)
                         for n, i in enumerate(range(0, len(results), 2)))
        for moment, i in moments:
            time.sleep(max((moment - datetime.now(UTC)).total_seconds(), 0))
            if cancel(results[i].id):
                cancelled.add(results[i].id)
        processes.wait_for(settled, 60, message="every task settled")
        time.sleep(0.5)  # a late duplicate would show now
    ran = [result_id for result_id, *_ in runs()]
    late = sorted((TimeoutTask.objects.get(job_id=int(r.split("-")[0])).started_at - due[i]).total_seconds()
                  for i, r in enumerate(r.id for r in results) if r in ran)
    print(f"{len(cancelled)} of 60 racing cancels won; lateness {late[len(late) // 2] * 1000:.1f} ms median, "
          f"{late[-1] * 1000:.1f} ms max")
    assert cancelled and len(cancelled) < 60, "some cancels must have won, some lost"
    assert len(ran) == len(set(ran)), "a task ran twice"
    assert not set(ran) & cancelled
    assert set(ran) | cancelled == {r.id for r in results}
    for result in results:
        result.refresh()
        assert result.status == (TaskResultStatus.FAILED if result.id in cancelled else TaskResultStatus.SUCCESSFUL)


@pytest.mark.timeout(30)
def test_each_queue_name_is_published_to_its_celery_queue(broker):
    broker.flushdb()
    tasks.record.enqueue("default queue")
    tasks.record_elsewhere.enqueue("other queue")
    assert scan() == 2
    assert queue_length(broker, "celery") == 1 and queue_length(broker, "timeouts-test-other") == 1
    broker.flushdb()
