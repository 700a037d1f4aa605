"""End to end through a real broker (Redis) and real Celery worker processes."""

import os
import signal
import threading
import time
from datetime import UTC, datetime, timedelta

import psutil
import pytest
from django.db import connection, transaction

from tests.support import processes
from timeouts.dispatch.scan import scan
from timeouts.models import TimeoutTask

Status = TimeoutTask.Status
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def scan_until(predicate, timeout, message):
    """Run the safety scan in-process (as beat would) until `predicate` holds."""
    def step():
        scan()
        return predicate()

    return processes.wait_for(step, timeout=timeout, interval=0.2, message=message)


def finished(n):
    return lambda: TimeoutTask.objects.filter(status=Status.DONE).count() >= n


@pytest.mark.timeout(90)
def test_due_tasks_run_once_on_their_queue_and_never_early(worker, starts):
    now = datetime.now(UTC)
    tasks = [TimeoutTask.objects.schedule("test.record", i, at=now + timedelta(seconds=1 + i / 10)) for i in range(10)]
    tasks.append(TimeoutTask.objects.schedule("test.queued", "q", at=now + timedelta(seconds=1)))
    scan_until(finished(len(tasks)), 60, "all tasks done")
    rows = starts.all()
    assert sorted(r[0] for r in rows) == sorted(t.job_id for t in tasks)
    assert all(started_at >= action_time for _, _, action_time, started_at in rows)


@pytest.mark.timeout(60)
def test_rolled_back_scheduling_never_runs(worker, starts):
    with pytest.raises(RuntimeError), transaction.atomic():
        TimeoutTask.objects.schedule("test.record", "rolled-back", delay=-1)
        raise RuntimeError
    committed = TimeoutTask.objects.schedule("test.record", "committed", delay=-1)
    scan_until(finished(1), 30, "the committed task")
    assert [r[0] for r in starts.all()] == [committed.job_id]


@pytest.mark.timeout(120)
def test_a_true_cancel_racing_dispatch_never_runs(worker, starts):
    now = datetime.now(UTC)
    TimeoutTask.objects.bulk_schedule(
        [{"biz_type": "test.record", "biz_id": i, "at": now + timedelta(milliseconds=5 * i)} for i in range(400)]
    )
    tasks = list(TimeoutTask.objects.order_by("action_time"))
    with processes.scanning(0.01):
        cancelled = set()
        for task in tasks[::2]:  # cancel every other task while they come due and get dispatched
            if task.cancel():
                cancelled.add(task.job_id)
            time.sleep(0.008)
        waiting = [Status.PENDING, Status.DISPATCHED, Status.RUNNING]
        processes.wait_for(
            lambda: not TimeoutTask.objects.filter(status__in=waiting).exists(), 60, message="all tasks settled"
        )
    ran = {r[0] for r in starts.all()}
    assert cancelled, "some cancels must have won"
    assert not ran & cancelled
    assert ran | cancelled == {t.job_id for t in tasks}


@pytest.mark.timeout(480)
def test_thousands_of_due_tasks_two_scanners_each_handler_starts_once(worker, starts):
    count = 3_000  # due at one instant: the scanners race over every claim of the backlog
    at = datetime.now(UTC) + timedelta(seconds=2)
    TimeoutTask.objects.bulk_schedule([{"biz_type": "test.record", "biz_id": i, "at": at} for i in range(count)])
    errors = []

    def scanner():
        try:
            while TimeoutTask.objects.filter(status=Status.PENDING).exists():
                scan(max_seconds=1)
                time.sleep(0.05)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=scanner) for _ in range(2)]
    for thread in threads:
        thread.start()
    processes.wait_for(finished(count), 420, interval=0.5, message=f"{count} tasks done")
    for thread in threads:
        thread.join(30)
    assert not errors
    with connection.cursor() as cursor:
        cursor.execute("""SELECT count(*), count(DISTINCT job_id), count(*) FILTER (WHERE started_at < action_time)
                          FROM timeouts_test_start""")
        assert cursor.fetchone() == (count, count, 0)


@pytest.mark.timeout(120)
def test_lease_expiry_redispatches_a_task_whose_worker_was_killed(worker, starts):
    task = TimeoutTask.objects.schedule("test.slow", "killed", delay=-1, attribute={"sleep": 60})
    scan()
    processes.wait_for(lambda: starts.count() == 1, 30, message="the first attempt to start")
    for process in psutil.Process(worker.pid).children(recursive=True) + [psutil.Process(worker.pid)]:
        os.kill(process.pid, signal.SIGKILL)  # the whole worker, mid-handler
    worker.wait(10)
    replacement = processes.celery_worker(env=processes.django_env(), name="replacement")
    try:
        # The lease (ttr=3 s) runs out; a scan recovers the task and dispatches attempt 2.
        scan_until(finished(1), 60, "the second attempt to finish")
    finally:
        processes.stop(replacement)
    assert [r[1] for r in starts.all()] == [1, 2]
    done = TimeoutTask.objects.get(job_id=task.job_id)
    assert (done.status, done.attempts) == (Status.DONE, 2) and "lease" in done.last_error


@pytest.mark.timeout(120)
def test_a_worker_whose_database_session_dies_after_the_handler_still_records_done(broker, starts):
    """The handler ran; before DONE is written the worker's session is terminated (a failover, a
    restart, an idle-session killer). The worker reconnects and writes DONE, instead of leaving the
    task RUNNING until its lease runs out and running the handler again."""
    env = processes.django_env(TIMEOUTS_FAULTS="run.before_done=sleep:2")
    with processes.running_worker(env=env, name="worker-session-killed"):
        task = TimeoutTask.objects.schedule("test.record", "session", delay=0)
        scan_until(lambda: starts.count() == 1, 30, "the handler to start")
        with connection.cursor() as cursor:  # every other session on the test database, the worker's too
            cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                           "WHERE datname = current_database() AND pid <> pg_backend_pid()")
        processes.wait_for(lambda: TimeoutTask.objects.get(pk=task.pk).status == Status.DONE, 30,
                           message="the task to be DONE without waiting for its lease (60 s)")
        assert starts.count() == 1 and TimeoutTask.objects.get(pk=task.pk).attempts == 1


@pytest.mark.timeout(90)
@pytest.mark.parametrize("pool", ["threads", "solo"])
def test_a_handler_slower_than_its_ttr_runs_once_on_a_pool_without_time_limits(broker, starts, pool):
    """These pools cannot stop a handler at its hard time limit: the worker extends the task's lease
    while the handler runs, and lease recovery does not dispatch the task again beside it."""
    broker.flushdb()
    with processes.running_worker(env=processes.django_env(), name=f"worker-{pool}", pool=pool, concurrency=2):
        task = TimeoutTask.objects.schedule("test.slow", pool, delay=0, attribute={"sleep": 7})  # ttr 3 s
        with processes.scanning(0.2):  # recovering expired leases, dispatching what is due
            processes.wait_for(lambda: starts.count() == 1, 30, message="the handler to start")
            processes.wait_for(lambda: TimeoutTask.objects.get(pk=task.pk).status == Status.DONE, 30,
                               message="the handler to end")
            time.sleep(1)  # another attempt would show now
    assert [attempt for _, attempt, *_ in starts.all()] == [1]
    done = TimeoutTask.objects.get(pk=task.pk)
    assert (done.status, done.attempts, done.last_error) == (Status.DONE, 1, "")


@pytest.mark.timeout(90)
def test_a_handler_slower_than_its_ttr_is_stopped_at_it_on_prefork_and_runs_again(broker, starts):
    """Prefork stops the handler at its hard time limit, its TTR, when its lease runs out: the next
    attempt never runs beside it."""
    broker.flushdb()
    with processes.running_worker(env=processes.django_env(), name="worker-prefork"):
        task = TimeoutTask.objects.schedule("test.slow", "prefork", delay=0, attribute={"sleep": 7})  # ttr 3 s
        with processes.scanning(0.2):
            processes.wait_for(lambda: TimeoutTask.objects.get(pk=task.pk).status == Status.DONE, 30,
                               message="the second attempt to end")
    first, second = starts.all()
    assert [first[1], second[1]] == [1, 2]
    assert (second[3] - first[3]).total_seconds() >= 3  # the first attempt's whole TTR
    done = TimeoutTask.objects.get(pk=task.pk)
    assert (done.status, done.attempts) == (Status.DONE, 2) and "lease" in done.last_error
