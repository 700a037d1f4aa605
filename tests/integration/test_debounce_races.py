"""on_conflict="debounce" under concurrency, each caller on a connection of its own: debounces of one
key against each other, against a batch, against a move of the row to another partition, and
against the dispatcher's claim."""

import random
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction

import timeouts
from timeouts.dispatch.claiming import claim_due
from timeouts.models import TimeoutTask

Status = TimeoutTask.Status
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

THREADS = 8
CALLS = 10


def start_threads(target, count, errors):
    """`count` threads running target(index), each on its own connection; what they raise goes to `errors`."""

    def run(index):
        try:
            target(index)
        except Exception as exc:  # pragma: no cover - reported by the test
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    return threads


def join(threads):
    for thread in threads:
        thread.join(90)
    assert not any(thread.is_alive() for thread in threads)


def run_threads(target, count):
    """start_threads() and join(): the errors the threads raised."""
    errors = []
    join(start_threads(target, count, errors))
    return errors


@pytest.mark.parametrize("max_wait", [None, timedelta(seconds=30)], ids=["no-cap", "capped"])
def test_concurrent_debounces_of_one_key_leave_one_pending_task_at_the_last_time(max_wait):
    """Eight callers released together, half of them inside transactions of their own: one task,
    moved by every call after the first, ending at the time of the call that came last (the one
    that moved it last), or at the cap."""
    barrier = threading.Barrier(THREADS)
    results = []

    def debounce(index):
        barrier.wait(30)
        for call in range(CALLS):
            if index % 2:
                with transaction.atomic():
                    task = timeouts.schedule("test.record", "k", delay=timedelta(minutes=5), on_conflict="debounce",
                                             max_wait=max_wait, attribute={"thread": index, "call": call})
            else:
                task = timeouts.schedule("test.record", "k", delay=timedelta(minutes=5), on_conflict="debounce",
                                         max_wait=max_wait, attribute={"thread": index, "call": call})
            results.append(task)

    assert run_threads(debounce, THREADS) == []
    [task] = TimeoutTask.objects.filter(biz_id="k")
    assert task.status == Status.PENDING and {result.job_id for result in results} == {task.job_id}
    last = max(results, key=lambda result: result.modified_at)
    assert (task.action_time, task.attribute, task.modified_at) == (last.action_time, last.attribute, last.modified_at)
    assert task.action_time == max(result.action_time for result in results)
    if max_wait is not None:
        assert {result.action_time for result in results} == {task.created_at + max_wait}


def backend_pid():
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def wait_for_lock_wait(pid, wait_event, timeout=30):
    """Until the backend `pid` waits for a lock of the kind `wait_event` (advisory, tuple, transactionid)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute("SELECT wait_event FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock'",
                           [pid])
            row = cursor.fetchone()
            if row and row[0] in wait_event:
                return
        time.sleep(0.02)
    raise AssertionError(f"backend {pid} never waited for a lock of {wait_event}")


def in_thread(call, in_transaction=False):
    """Start call() in a thread on its own connection; returns (thread, {"pid", "result" or "error"})."""
    outcome = {}

    def run():
        try:
            outcome["pid"] = backend_pid()
            if in_transaction:
                with transaction.atomic():
                    outcome["result"] = call()
            else:
                outcome["result"] = call()
        except Exception as exc:  # pragma: no cover - reported by the test
            outcome["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    deadline = time.monotonic() + 30
    while "pid" not in outcome and "error" not in outcome and time.monotonic() < deadline:
        time.sleep(0.01)
    return thread, outcome


@pytest.mark.parametrize("in_transaction", [False, True], ids=["autocommit", "in-transaction"])
def test_a_debounce_waiting_for_a_row_that_moves_to_another_partition_follows_it(in_transaction):
    """A reschedule moves the task to another partition while the debounce waits for its row lock:
    PostgreSQL fails the debounce's read with 40001, and it runs again where the row is now."""
    task = timeouts.schedule("test.record", "k", delay=timedelta(minutes=1), on_conflict="debounce")
    with transaction.atomic():
        assert timeouts.reschedule("test.record", "k", delay=timedelta(days=3))  # another day: another partition
        thread, outcome = in_thread(lambda: timeouts.schedule(
            "test.record", "k", delay=timedelta(minutes=5), on_conflict="debounce", attribute={"moved": True}),
            in_transaction)
        wait_for_lock_wait(outcome["pid"], ("transactionid", "tuple"))
    thread.join(30)
    assert "error" not in outcome, outcome.get("error")
    moved = outcome["result"]
    assert moved.job_id == task.job_id and moved.attribute == {"moved": True}
    [stored] = TimeoutTask.objects.filter(biz_id="k")
    assert stored.action_time == moved.action_time and stored.action_time - stored.modified_at < timedelta(minutes=6)


@pytest.mark.parametrize("by_bucket", [False, True], ids=["keys", "buckets"])
@pytest.mark.parametrize("first", ["batch", "debounce"])
def test_a_batch_and_a_debounce_of_one_key_wait_for_each_other(first, by_bucket, monkeypatch):
    """The function takes the key's locks as lock_biz_key does: a batch that locks the key, or its
    bucket, holds a debounce off until it commits, and the other way round; whichever comes second
    finds the task the first created, and moves it."""
    from timeouts.store import scheduling

    monkeypatch.setattr(scheduling, "MAX_KEY_LOCKS", 2 if by_bucket else 1024)
    item = {"biz_type": "test.record", "on_conflict": "debounce", "delay": timedelta(minutes=1)}
    calls = {"batch": lambda: timeouts.bulk_schedule([{**item, "biz_id": key, "attribute": {"by": "batch"}}
                                                      for key in ("a", "shared", "b")]),
             "debounce": lambda: timeouts.schedule("test.record", "shared", delay=timedelta(minutes=2),
                                                   on_conflict="debounce", attribute={"by": "debounce"})}
    second = "debounce" if first == "batch" else "batch"
    with transaction.atomic():
        calls[first]()
        thread, outcome = in_thread(calls[second])
        wait_for_lock_wait(outcome["pid"], ("advisory",))
    thread.join(30)
    assert "error" not in outcome, outcome.get("error")
    [task] = TimeoutTask.objects.filter(biz_id="shared")
    assert task.status == Status.PENDING and task.attribute == {"by": second}


def test_debounces_racing_the_claim_lose_no_task_run_none_twice_and_none_early():
    """Writers debounce a few keys to times a few milliseconds ahead while a claimer claims with the
    dispatcher's statement. For every task: either the move won (the claim took it at its moved
    time) or the claim won (the debounce found no PENDING task and created a new one). So each task
    is claimed exactly once, at the time the last call that returned it gave it, never before that
    time; and each key has as many tasks as its calls created."""
    keys = [f"k{i}" for i in range(12)]
    max_wait = timedelta(milliseconds=150)
    writers, duration = 4, 2.5
    barrier = threading.Barrier(writers + 1)
    writing = threading.Event()
    calls, claims = [], []

    def write(index):
        rng = random.Random(index)
        barrier.wait(30)
        deadline = time.monotonic() + duration
        while time.monotonic() < deadline:
            calls.append(timeouts.schedule("test.record", rng.choice(keys), on_conflict="debounce", max_wait=max_wait,
                                           delay=timedelta(milliseconds=rng.randint(0, 40))))

    def claim(_index):
        barrier.wait(30)
        while True:
            claimed = claim_due(100)
            claims.extend(claimed)
            if not claimed and not writing.is_set() and not TimeoutTask.objects.pending().exists():
                return
            time.sleep(0.002)

    errors = []
    writing.set()
    claimer = start_threads(claim, 1, errors)
    join(start_threads(write, writers, errors))
    writing.clear()
    join(claimer)
    assert errors == []

    tasks = {task.job_id: task for task in TimeoutTask.objects.all()}
    claimed = [claim.job_id for claim in claims]
    assert len(claimed) == len(set(claimed)), "a task was claimed twice"
    assert set(claimed) == set(tasks) == {call.job_id for call in calls}, "a task was lost or never claimed"
    assert {task.status for task in tasks.values()} == {Status.DISPATCHED}
    by_job = {}
    for call in sorted(calls, key=lambda call: call.modified_at):
        by_job.setdefault(call.job_id, []).append(call)
    for claim in claims:
        assert claim.run_at <= claim.claimed_at, f"claimed before its time: {claim}"
        last = by_job[claim.job_id][-1]
        assert claim.run_at == last.action_time == tasks[claim.job_id].action_time, "a move was lost"
    for call in calls:
        assert call.action_time <= call.created_at + max_wait
    # Both outcomes of the race happened: tasks moved by later calls, keys given more than one task.
    assert any(len(returned) > 1 for returned in by_job.values())
    assert len(tasks) > len(keys)
