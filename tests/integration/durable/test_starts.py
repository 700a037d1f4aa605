"""A DurableTask call started ahead by the worker's main process, with the database: the confirmation
its pool process asks for before the body, and the hand-over of a start racing its give-back when
the consumer stops on another thread (call_starts.py; without a database: tests/unit)."""

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from celery.exceptions import Ignore
from django.db import connection

from tests.support.factories import make_task
from tests.testapp import tasks
from timeouts.durable.starts import _Start, _starter
from timeouts.durable.task import _run_fenced
from timeouts.models import TimeoutTask
from timeouts.protocol import Fence, from_header
from timeouts.store import worker_connection
from timeouts.store.queries import fetch_one
from timeouts.store.recovery import recover_expired
from timeouts.worker import attempt

Status = TimeoutTask.Status


def key_of(task) -> dict:
    return {"job_id": task.job_id, "action_time": task.action_time}


def partition_of(task) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT tableoid::regclass::text FROM timeouts_task WHERE job_id = %s", [task.job_id])
        return cursor.fetchone()[0]


def lease_left(task) -> float:
    with connection.cursor() as cursor:
        cursor.execute("SELECT extract(epoch FROM lease_until - clock_timestamp()) FROM timeouts_task "
                       "WHERE job_id = %s", [task.job_id])
        return float(cursor.fetchone()[0])


def state(task):
    task = TimeoutTask.objects.get(job_id=task.job_id)
    return task.status, task.attempts


@pytest.mark.django_db
@pytest.mark.parametrize("on_partition", [True, False])
def test_confirm_start_holds_for_the_running_attempt_and_renews_its_lease(on_partition):
    task = make_task(Status.RUNNING, lease=timedelta(seconds=-5))  # run out, not recovered yet
    partition = partition_of(task) if on_partition else None
    assert attempt.confirm_start(key_of(task), 2, partition) is False  # another attempt's
    assert attempt.confirm_start(key_of(task), 1, partition) is True
    assert task.ttr - 5 < lease_left(task) <= task.ttr


@pytest.mark.django_db
def test_confirm_start_refuses_a_start_that_lease_recovery_took_back():
    task = make_task(Status.RUNNING, lease=timedelta(seconds=-5))
    assert recover_expired() == 1
    assert attempt.confirm_start(key_of(task), 1, partition_of(task)) is False
    assert state(task) == (Status.PENDING, 1)  # untouched


@pytest.mark.django_db
def test_confirm_start_refuses_an_ended_start():
    task = make_task(Status.DONE)
    assert attempt.confirm_start(key_of(task), 1) is False


@pytest.mark.django_db(transaction=True)
def test_a_call_whose_start_ahead_no_longer_holds_is_dropped_before_its_body():
    """The main process recorded the start; the call waited for a process until its lease ran out
    and lease recovery took it back. Its body does not run."""
    task = make_task(Status.RUNNING, lease=timedelta(seconds=-5))
    started = {"row": fetch_one("find_task", {"job_id": task.job_id}), "not_before": 0.0}
    assert recover_expired() == 1
    fence = [task.job_id, task.action_time.isoformat(), 1, partition_of(task), "default", started]
    ran = []
    try:
        with pytest.raises(Ignore):
            _run_fenced(tasks.record, from_header(fence), lambda: ran.append(True), (), {})
    finally:
        worker_connection.close()
    assert ran == []
    assert state(task) == (Status.PENDING, 1)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("holds", [True, False])
def test_a_start_taken_over_before_it_may_have_run_out_is_not_looked_at_again(holds):
    """Within half its TTR of the start (`holds_until`) the pool process runs the body without a
    statement: the lease the start took is as it was. Later it confirms the start, which renews it."""
    task = make_task(Status.RUNNING, lease=timedelta(seconds=100))
    started = {"row": fetch_one("find_task", {"job_id": task.job_id}), "not_before": 0.0,
               "holds_until": time.monotonic() + (60 if holds else -1)}
    fence = [task.job_id, task.action_time.isoformat(), 1, partition_of(task), "default", started]
    seen = []
    try:
        _run_fenced(tasks.record, from_header(fence), lambda: seen.append(lease_left(task)), (), {})
    finally:
        worker_connection.close()
    [left] = seen
    assert 95 < left <= 100 if holds else task.ttr - 5 < left <= task.ttr, left
    assert state(task) == (Status.DONE, 1)


@pytest.mark.django_db(transaction=True)
def test_calls_received_together_start_together_and_each_as_alone():
    """start_calls_ahead: the calls of one partition in one statement; a call that partition does not
    hold (its row moved), through the parent; a stale one, a cancelled one, and one due later than
    `ahead`, not at all."""
    soon = datetime.now(UTC) + timedelta(seconds=0.5)
    together = [make_task(Status.DISPATCHED, biz_id=str(i), at=soon) for i in range(3)]
    moved = make_task(Status.DISPATCHED, biz_id="moved", at=soon)
    stale = make_task(Status.DISPATCHED, biz_id="stale", at=soon)
    cancelled = make_task(Status.PENDING, biz_id="cancelled", at=soon)
    later = make_task(Status.DISPATCHED, biz_id="later", at=soon + timedelta(seconds=5))
    assert cancelled.cancel() is True
    partition = partition_of(together[0])
    fences = [Fence(t.job_id, t.action_time, 1, partition) for t in [*together, cancelled, later]]
    fences += [Fence(moved.job_id, moved.action_time, 1, "timeouts_task_gone"),
               Fence(stale.job_id, stale.action_time, 2, partition)]
    rows = attempt.start_calls_ahead(fences, 1.0)
    assert sorted(rows) == sorted(t.job_id for t in [*together, moved])
    for task in [*together, moved]:
        assert state(task) == (Status.RUNNING, 1)
        assert rows[task.job_id]["run_at"] == task.run_at and "database_now" in rows[task.job_id]
    assert state(stale) == (Status.DISPATCHED, 0)
    assert state(cancelled) == (Status.CANCELLED, 0)
    assert state(later) == (Status.DISPATCHED, 0)


# --- A start handed over while the consumer gives the starts back -----------------------------------

def held_start(task) -> _Start:
    """A start the worker's main process recorded ahead for `task` (RUNNING, attempt 1), for a
    message the worker holds, as _starter.submit() and its thread leave it."""
    start = _Start(Fence(task.job_id, task.action_time, 1, partition_of(task)))
    with _starter.lock:
        _starter.held.add(start)
    assert start.begin()
    assert start.answer({"row": fetch_one("find_task", {"job_id": task.job_id}), "not_before": 0.0})
    return start


def consumer_stopping():
    """The consumer step GiveBackStarts stopping, on a thread of its own."""
    def stop():
        try:
            _starter.give_back()
        finally:
            worker_connection.close()

    thread = threading.Thread(target=stop, name="consumer-stopping")
    thread.start()
    return thread


@pytest.mark.django_db(transaction=True)
def test_a_start_handed_over_after_the_consumer_listed_it_is_not_given_back():
    """The consumer lists the starts it holds; the timer hands one over to a pool process; the
    consumer then gives back what it listed: not that one, which the pool process runs."""
    task = make_task(Status.RUNNING)
    start = held_start(task)
    listed, handed_over = threading.Barrier(2, timeout=10), threading.Barrier(2, timeout=10)
    give_back = start.give_back

    def give_back_once_handed_over():
        listed.wait()  # _starter.give_back() has listed the start
        handed_over.wait()  # the timer has handed it over
        return give_back()

    start.give_back = give_back_once_handed_over
    consumer = consumer_stopping()
    listed.wait()
    handed = start.take()
    handed_over.wait()
    consumer.join(10)
    assert handed is not None
    assert state(task) == (Status.RUNNING, 1)  # the pool process's start


@pytest.mark.django_db(transaction=True)
def test_a_start_given_back_before_the_timer_comes_is_never_handed_over():
    task = make_task(Status.RUNNING)
    start = held_start(task)
    consumer_stopping().join(10)
    assert state(task) == (Status.PENDING, 0)  # published again at once, its attempt unused
    assert start.take() is None  # the pool process tries the compare-and-set itself, and drops it


@pytest.mark.django_db(transaction=True)
def test_a_start_handed_over_before_the_consumer_stops_stays_the_pool_processs():
    task = make_task(Status.RUNNING)
    start = held_start(task)
    assert start.take() is not None
    consumer_stopping().join(10)
    assert state(task) == (Status.RUNNING, 1)
