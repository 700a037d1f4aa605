"""Business isolation on real processes: dispatcher processes, Celery workers (one killed -9 in the
middle of its handlers), the safety scan. A concurrency limit holds across all of them and a dead
worker's slots come back when their leases run out; a rate limit bounds the starts; a paused
biz_type waits without keeping the dispatcher busy or delaying the others, and catches up on resume."""

import os
import signal
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

import timeouts
from tests.support import processes
from tests.support.isolation import no_limits  # noqa: F401  (a fixture)
from tests.system.test_dispatcher import dispatcher_process, dispatcher_thread, lateness
from timeouts.models import TimeoutTask

Status = TimeoutTask.Status
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.usefixtures("no_limits")]
ON_TIME = 1.0  # seconds: the most a start may lag its action_time in these tests


def schedule_due(biz_type, n, *, attribute=None, ago=1.0):
    at = datetime.now(UTC) - timedelta(seconds=ago)
    TimeoutTask.objects.bulk_schedule([{"biz_type": biz_type, "biz_id": f"{biz_type}-{i}", "attribute": attribute or {},
                                        "at": at + timedelta(milliseconds=i)} for i in range(n)])


class InFlight:
    """Samples, on a connection of its own, how many tasks of a biz_type are claimed or running."""

    def __init__(self, biz_type):
        self.biz_type, self.most, self.samples = biz_type, 0, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample)

    def _sample(self):
        try:
            while not self.stop.is_set():
                with connection.cursor() as cursor:
                    cursor.execute("SELECT count(*) FROM timeouts_task WHERE biz_type = %s AND status IN (%s, %s)",
                                   [self.biz_type, Status.DISPATCHED, Status.RUNNING])
                    self.most = max(self.most, cursor.fetchone()[0])
                self.samples += 1
                time.sleep(0.01)
        finally:
            connection.close()

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(10)


def count(biz_type, status):
    return TimeoutTask.objects.filter(biz_type=biz_type, status=status).count()


@pytest.mark.timeout(180)
def test_a_concurrency_limit_holds_across_dispatchers_and_workers_and_a_killed_worker_s_slots_come_back(
        broker, starts):

    timeouts.set_limits("test.slow", concurrency=2)
    # test.slow sleeps on its first attempt, returns on the next; its TTR is 3 s. Due 0.2 s apart,
    # so that each is claimed alone and travels alone (tasks claimed together share a message,
    # which one worker process runs task after task).
    now = datetime.now(UTC)
    TimeoutTask.objects.bulk_schedule([{"biz_type": "test.slow", "biz_id": i, "attribute": {"sleep": 1.5},
                                        "at": now + timedelta(seconds=2 + 0.2 * i)} for i in range(6)])
    env = processes.django_env()
    first = processes.celery_worker(env=env, name="worker-isolation-1", concurrency=3)
    second = None
    try:
        with InFlight("test.slow") as in_flight, processes.scanning(0.5), \
                dispatcher_process("dispatcher-isolation-1"), dispatcher_process("dispatcher-isolation-2"):
            processes.wait_for_worker(first, "the first worker")
            processes.wait_for(lambda: count("test.slow", Status.RUNNING) == 2, 30, message="two handlers running")
            time.sleep(0.2)
            assert count("test.slow", Status.RUNNING) == 2  # three processes, two slots
            os.killpg(first.pid, signal.SIGKILL)  # the worker dies with both handlers
            first.wait(10)
            killed_at = datetime.now(UTC)
            second = processes.celery_worker(env=env, name="worker-isolation-2", concurrency=3)
            processes.wait_for(lambda: count("test.slow", Status.DONE) == 6, 90, message="every task to end")
        assert in_flight.samples > 50 and in_flight.most == 2
    finally:
        processes.stop(first)
        if second is not None:
            processes.stop(second)
    runs = starts.all()
    assert len(runs) == 8  # the two killed handlers ran again
    reruns = [started_at for _, attempt, _, started_at in runs if attempt == 2]
    # Their slots were held until their leases (3 s after they started) ran out.
    assert len(reruns) == 2 and min(reruns) > killed_at + timedelta(seconds=1)


@pytest.mark.timeout(120)
def test_a_rate_limit_bounds_the_starts(worker, starts):
    rate = 4.0
    timeouts.set_limits("test.record", rate_limit=rate)
    schedule_due("test.record", 14)
    with dispatcher_process("dispatcher-rate"):
        processes.wait_for(lambda: starts.count() == 14, 60, message="every task to start")
    times = sorted(started_at for *_, started_at in starts.all())
    # A token bucket of at most one second's worth: any n starts in a row span at least
    # (n - rate) / rate seconds. A little slack for claims that travel together.
    for i in range(len(times)):
        for j in range(i + 1, len(times)):
            n = j - i + 1
            assert (times[j] - times[i]).total_seconds() >= (n - rate - 1) / rate, (i, j, times)
    assert (times[-1] - times[0]).total_seconds() >= (14 - rate - 1) / rate


@pytest.mark.timeout(120)
def test_a_paused_biz_type_waits_without_delaying_the_others_and_catches_up_on_resume(worker, starts):
    timeouts.pause("test.queued")
    schedule_due("test.queued", 20)
    with dispatcher_thread() as dispatcher:
        time.sleep(1.0)
        before = dispatcher.stats.snapshot()
        time.sleep(2.0)
        after = dispatcher.stats.snapshot()
        # Asleep, not claiming again and again for the paused tasks.
        assert after["wakeups"] - before["wakeups"] <= 2, (before, after)
        task = TimeoutTask.objects.schedule("test.record", "other", delay=0.3)
        processes.wait_for(lambda: starts.count() == 1, 10, message="the other biz_type's task to start")
        [row] = starts.all()
        assert row[0] == task.job_id and 0 <= lateness([row])[0] < ON_TIME
        assert count("test.queued", Status.PENDING) == 20
        timeouts.resume("test.queued")
        processes.wait_for(lambda: starts.count() == 21, 10, message="the paused tasks, resumed, to start")


@pytest.mark.timeout(120)
def test_a_limits_row_written_by_hand_past_the_bounds_delays_no_other_biz_type(worker, starts):
    # A rate of one start in 300,000 years, its bucket just emptied: out of the API's bounds, within
    # the table's constraints. Its tasks wait; the dispatcher's statements must still run.
    schedule_due("test.queued", 5)
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO timeouts_limits (biz_type, overridden, rate_limit, tokens, refilled_at) "
                       "VALUES ('test.queued', true, 1e-13, 0, now())")
    with dispatcher_thread() as dispatcher:
        time.sleep(1.0)
        tasks = [TimeoutTask.objects.schedule("test.record", f"other-{n}", delay=0.3) for n in range(3)]
        processes.wait_for(lambda: starts.count() == 3, 10, message="the other biz_type's tasks to start")
        assert dispatcher.stats.snapshot()["errors"] == 0
    assert sorted(row[0] for row in starts.all()) == sorted(task.job_id for task in tasks)
    assert all(0 <= late < ON_TIME for late in lateness(starts.all()))
    assert count("test.queued", Status.PENDING) == 5


@pytest.mark.timeout(180)
def test_a_task_due_on_time_starts_ahead_of_a_backlog_waiting_in_the_broker(broker, starts):
    """A backlog's claims wait in the broker (up to MAX_DISPATCHED of them) for the workers; a task
    that falls due meanwhile is claimed on time, and its message passes them there."""
    schedule_due("test.slow", 3000, attribute={"sleep": 0.01})  # 30 s of work for one process
    with processes.running_worker(env=processes.django_env(), name="worker-backlog", concurrency=1):
        with dispatcher_process("dispatcher-backlog"):
            processes.wait_for(lambda: count("test.slow", Status.DISPATCHED) >= 500, 30,
                               message="a backlog in the broker")
            task = TimeoutTask.objects.schedule("test.record", "on-time", delay=0.5)
            processes.wait_for(lambda: TimeoutTask.objects.get(job_id=task.job_id).status == Status.DONE, 30,
                               message="the task due on time to end")
            backlog_left = count("test.slow", Status.PENDING) + count("test.slow", Status.DISPATCHED)
    [late] = lateness([row for row in starts.all() if row[0] == task.job_id])
    assert backlog_left > 1000, backlog_left  # it did not merely wait for the backlog to end
    assert 0 <= late < ON_TIME, late


@pytest.mark.timeout(120)
def test_a_task_claimed_on_time_takes_the_process_of_a_backlog_s_batch(broker, starts):
    """A worker of one process holds the message of a task claimed ahead until its ETA, and
    meanwhile runs a backlog's batch (0.9 s of handlers), which is still running when the task falls
    due. The batch gives its unstarted tasks back and frees the process, rather than keeping the
    task waiting until it ends; the tasks given back are claimed again and each runs once."""
    with processes.running_worker(env=processes.django_env(), name="worker-give-way", concurrency=1):
        # A lead longer than the test: every task is claimed as soon as it is scheduled.
        with dispatcher_process("dispatcher-give-way", "--lead", "10"):
            due = time.monotonic() + 3.0
            task = TimeoutTask.objects.schedule("test.record", "on-time", delay=3.0)
            processes.wait_for(lambda: TimeoutTask.objects.get(job_id=task.job_id).status == Status.DISPATCHED, 10,
                               message="the task to be claimed")
            time.sleep(due - 0.5 - time.monotonic())
            schedule_due("test.slow", 9, attribute={"sleep": 0.1}, ago=5.0)  # one batch, 0.9 s of work
            processes.wait_for(lambda: count("test.slow", Status.DONE) == 9, 30, message="the backlog to end")
            processes.wait_for(lambda: TimeoutTask.objects.get(job_id=task.job_id).status == Status.DONE, 30,
                               message="the task claimed on time to end")
    runs = starts.all()
    backlog = [started_at for job_id, _, _, started_at in runs if job_id != task.job_id]
    [on_time] = [started_at for job_id, _, _, started_at in runs if job_id == task.job_id]
    assert len(backlog) == 9 and len({job_id for job_id, *_ in runs}) == 10  # each once
    assert sum(started_at > on_time for started_at in backlog) >= 2, (on_time, backlog)  # before the batch's rest
