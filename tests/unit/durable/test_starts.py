"""The hand-over between the worker's main-process thread that starts calls ahead and the timer
that sends them to a pool process: each compare-and-set is run by one of the two, never both, and
a start is either handed over or given back (the worker dropped its message), never both. With a
database: tests/integration/durable/test_starts.py."""

import gc
import os
import threading
import time
import uuid
import weakref
from datetime import UTC, datetime, timedelta

from kombu.message import Message

from tests.testapp import tasks
from timeouts.durable import starts as call_starts
from timeouts.durable.starts import StartingRequest, _DatabaseClock, _Start
from timeouts.protocol import FENCE_HEADER, from_header
from timeouts.worker import leases

FENCE_FIELDS = [1, "2026-01-01T00:00:00+00:00", 1, None, "default"]
FENCE = from_header(FENCE_FIELDS)
# What the thread's compare-and-set answers (a long lease: no extension falls due in these tests).
STARTED = {"row": {"job_id": 1, "ttr": 60}, "not_before": 0.0}


def kept(start) -> bool:
    """Whether this process keeps the start's lease."""
    return start.lease is not None and start.lease in leases.heartbeat.leases


def answered_start():
    start = _Start(FENCE)
    start.begin()
    start.answer(STARTED)
    return start


def a_request(start):
    """A DurableTask request as the worker makes one from its message, holding `start` as the start
    recorded ahead for it (received without an eta, it starts nothing itself)."""
    task = tasks.record
    message = Message(body=b"", headers={"id": str(uuid.uuid4()), "task": task.name, FENCE_HEADER: FENCE_FIELDS},
                      delivery_info={}, properties={})
    request = StartingRequest(message, app=task.app, task=task, body=((), {}, {}), decoded=True)
    request._ahead = start
    return request


def test_a_start_the_thread_has_not_begun_is_abandoned_and_never_run():
    start = _Start(FENCE)
    assert start.take() is None
    assert start.begin() is False  # the thread skips it: the pool process starts the call itself


def test_a_start_being_run_is_waited_for_and_handed_over():
    start = _Start(FENCE)
    assert start.begin() is True
    threading.Timer(0.05, start.answer, (STARTED,)).start()
    assert start.take() == STARTED


def test_a_refused_start_hands_over_nothing():
    start = _Start(FENCE)
    assert start.begin() is True
    start.answer(None)
    assert start.take() is None


def test_a_start_given_back_before_it_begins_is_never_run_nor_handed_over():
    start = _Start(FENCE)
    assert start.give_back() is None  # nothing recorded: nothing for the database
    assert start.begin() is False
    assert start.take() is None  # the pool process starts the call itself, if Celery still runs it


def test_a_recorded_start_given_back_is_never_handed_over():
    start = _Start(FENCE)
    assert start.begin() is True
    assert start.answer(STARTED) is True
    assert kept(start)
    assert start.give_back() == STARTED
    assert not kept(start)
    assert start.take() is None


def test_a_start_handed_over_is_never_given_back():
    start = _Start(FENCE)
    assert start.begin() is True
    assert start.answer(STARTED) is True
    assert start.take() == STARTED
    assert start.give_back() is None  # the pool process runs it: nothing goes back to the database


def test_a_start_handed_over_keeps_its_lease_while_its_request_waits_for_a_process():
    start = _Start(FENCE)
    start.begin()
    start.answer(STARTED)
    waiting = threading.Event()
    waiting.set()
    assert start.take(waiting.is_set) == STARTED
    assert kept(start) and start.lease.kept()
    waiting.clear()  # a pool process took it over: its own heartbeat keeps the lease from now on
    assert not start.lease.kept()


def test_a_start_handed_over_with_its_request_is_let_go_once_a_pool_process_accepts_the_request():
    start = answered_start()
    request = a_request(start)
    request._hand_over_start()
    assert kept(start)
    request.on_accepted(os.getpid(), time.monotonic())
    assert not kept(start)  # the pool process's confirm_start renews the lease, its heartbeat keeps it


def test_the_lease_of_a_start_handed_over_does_not_keep_its_request_alive():
    """The heartbeat drops a lease it no longer keeps at its next beat only: until then the request,
    with its message and arguments, is free to go, rather than held in the worker's main process."""
    start = answered_start()
    request = a_request(start)
    request._hand_over_start()
    gone = weakref.ref(request)
    del request
    gc.collect()
    assert gone() is None
    assert kept(start) and not start.lease.kept()  # a request gone waits for no process


def test_a_start_that_answers_too_late_is_abandoned_and_given_back_by_the_thread(monkeypatch):
    monkeypatch.setattr(call_starts, "ANSWER_TIMEOUT", 0.01)
    start = _Start(FENCE)
    assert start.begin() is True
    assert start.take() is None  # the pool process tries the compare-and-set itself
    assert start.answer(STARTED) is False  # so the thread gives back what it recorded
    assert not kept(start)


def test_a_start_given_back_while_being_recorded_is_left_to_the_thread_to_give_back():
    start = _Start(FENCE)
    assert start.begin() is True
    assert start.give_back() is None  # its answer has not come yet
    assert start.answer(STARTED) is False  # the thread gives it back
    assert not kept(start)
    assert start.take() is None


def test_the_database_clock_offset_is_the_closest_bound_of_the_window():
    clock = _DatabaseClock()
    assert clock.offset("a", -0.004) == -0.004
    assert clock.offset("a", -0.001) == -0.001
    assert clock.offset("a", -0.003) == -0.001  # a slower answer bounds it less closely
    assert clock.offset("b", 5.0) == 5.0  # each shard's database has a clock of its own


def test_bounds_older_than_the_window_are_dropped():
    clock = _DatabaseClock()
    clock.WINDOW = 0.05
    clock.offset("a", 1.0)
    time.sleep(0.06)
    assert clock.offset("a", 0.5) == 0.5


def test_the_starts_queued_while_the_thread_records_others_are_recorded_together(monkeypatch):
    """The thread takes every start queued while its previous statement ran, so the calls one claim
    published together share one statement: here three, behind the first."""
    batches, first_begun, go_on = [], threading.Event(), threading.Event()

    def record(fences):
        batches.append(len(fences))
        if len(batches) == 1:
            first_begun.set()
            go_on.wait(5)
        return [STARTED] * len(fences)

    monkeypatch.setattr(call_starts, "_record", record)
    starter = call_starts._Starter()
    first = starter.submit(FENCE)
    assert first_begun.wait(5)
    queued = [starter.submit(FENCE) for _ in range(3)]
    go_on.set()
    assert all(start.answered.wait(5) for start in [first, *queued])
    assert batches == [1, 3]
    for start in [first, *queued]:
        start.give_back()


def test_a_start_holds_without_a_look_for_half_its_ttr_from_before_its_statement():
    row = {"job_id": 1, "ttr": 60, "attribute": {"task": "t"}, "run_at": datetime(2026, 1, 1, tzinfo=UTC),
           "database_now": datetime(2026, 1, 1, tzinfo=UTC) - timedelta(seconds=0.3)}
    handed = call_starts._handed_over(row, "shard-of-its-own", sent=100.0, answered=100.01)
    assert handed["holds_until"] == 100.0 + 30
    assert handed["row"]["attribute"] is None and "database_now" not in handed["row"]
    # run_at is 0.3 s after the database's clock read, which came before the answer
    assert abs(handed["not_before"] - (100.01 + 0.3)) < 1e-6
