"""bulk_schedule() and on_conflict: each item meets its key's waiting task, and the earlier items of
its key in the batch, as schedule() calls one after the other would; in a few statements whatever
the batch's size; and a conflict stores nothing."""

import threading
import time

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

import timeouts
from timeouts.models import TimeoutTask

Status = TimeoutTask.Status
pytestmark = pytest.mark.django_db


def item(biz_id, delay=60, **options):
    return {"biz_type": "test.record", "biz_id": biz_id, "delay": delay, **options}


def due_in(task) -> float:
    """Seconds from the task's creation to its action_time (the database clock, read once per batch)."""
    return (task.action_time - task.created_at).total_seconds()


def waiting(biz_id):
    return list(TimeoutTask.objects.filter(biz_id=biz_id, status__in=[Status.PENDING, Status.DISPATCHED])
                .order_by("job_id"))


def test_by_default_an_item_whose_key_has_a_waiting_task_fails_the_whole_batch():
    first = timeouts.schedule("test.record", "taken", delay=60)
    with pytest.raises(timeouts.TaskConflict, match=rf"item 2: test.record:taken .*job_id {first.job_id}"):
        timeouts.bulk_schedule([item("a"), item("b"), item("taken"), item("c")])
    assert list(TimeoutTask.objects.values_list("job_id", flat=True)) == [first.job_id]


def test_two_items_of_one_key_conflict_by_default():
    with pytest.raises(timeouts.TaskConflict, match="item 3: item 1 of the same batch"):
        timeouts.bulk_schedule([item("a"), item("dup"), item("b"), item("dup")])
    with pytest.raises(timeouts.TaskConflict, match="item 1: item 0"):
        timeouts.bulk_schedule([item(7), item("7")])  # one key: biz_id is stored as str()
    assert TimeoutTask.objects.count() == 0


def test_keep_keeps_the_waiting_task_or_the_first_item():
    first = timeouts.schedule("test.record", "taken", delay=60)
    assert timeouts.bulk_schedule([item("taken", on_conflict="keep"), item("new", 10, on_conflict="keep"),
                                   item("new", 20, on_conflict="keep")]) == 1
    assert [task.job_id for task in waiting("taken")] == [first.job_id]
    [new] = waiting("new")  # the first item of the key; the second kept it
    assert abs(due_in(new) - 10) < 1


def test_replace_cancels_the_waiting_task_and_the_last_item_wins():
    first = timeouts.schedule("test.record", "taken", delay=60)
    assert timeouts.bulk_schedule([item("taken", 5, on_conflict="replace"), item("new", 10),
                                   item("new", 20, on_conflict="replace"), item("new", 30, on_conflict="replace")]) == 2
    assert TimeoutTask.objects.get(job_id=first.job_id).status == Status.CANCELLED
    [taken] = waiting("taken")
    [new] = waiting("new")
    assert abs(due_in(taken) - 5) < 1
    assert abs(due_in(new) - 30) < 1
    # The items replaced inside the batch were never stored.
    assert TimeoutTask.objects.filter(biz_id="new").count() == 1


def test_none_adds_beside_and_counts_as_waiting_for_the_items_after_it():
    first = timeouts.schedule("test.record", "k", delay=60)
    assert timeouts.bulk_schedule([item("k", on_conflict=None), item("k", on_conflict=None)]) == 2
    assert len(waiting("k")) == 3
    with pytest.raises(timeouts.TaskConflict, match="item 1: item 0"):
        timeouts.bulk_schedule([item("n", on_conflict=None), item("n")])
    assert timeouts.bulk_schedule([item("m", on_conflict=None), item("m", on_conflict="replace")]) == 1
    assert len(waiting("m")) == 1 and first.job_id in {task.job_id for task in waiting("k")}


def test_the_statements_do_not_grow_with_the_batch():
    def statements(keys, **options):
        with CaptureQueriesContext(connection) as captured:
            assert timeouts.bulk_schedule([item(key, **options) for key in keys]) == len(keys)
        return len(captured.captured_queries)

    few = statements(["a", "b", "c"])
    assert statements([f"k{i}" for i in range(300)]) == few
    for i in range(300):  # every key of the next batch has a waiting task
        timeouts.schedule("test.record", f"r{i}", delay=60)
    assert statements([f"r{i}" for i in range(300)], on_conflict="replace") == few + 1  # one UPDATE cancels them
    assert TimeoutTask.objects.filter(status=Status.CANCELLED).count() == 300


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
def test_concurrent_batches_over_the_same_keys_keep_one_waiting_task_each_and_never_deadlock():
    """Two threads, each its own connection, schedule the same keys in opposite orders: the locks
    are taken in one order whatever the batch's, so neither waits for the other in a circle."""
    keys = [f"k{i}" for i in range(200)]
    barrier = threading.Barrier(2)
    errors, created = [], []

    def schedule_all(order):
        try:
            barrier.wait(30)
            for _ in range(5):
                created.append(timeouts.bulk_schedule([item(key, on_conflict="keep") for key in order]))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=schedule_all, args=(order,)) for order in (keys, keys[::-1])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(50)
    assert not errors and not any(thread.is_alive() for thread in threads)
    assert sum(created) == len(keys)
    found = TimeoutTask.objects.filter(status=Status.PENDING)
    assert found.count() == len(keys) == found.values("biz_id").distinct().count()


@pytest.mark.timeout(120)
def test_a_batch_of_more_keys_than_the_lock_table_holds_still_settles_each_key():
    """PostgreSQL's lock table holds some thousands of locks in all: a batch that locked each of its
    keys would fail ("out of shared memory") past them. It locks its keys' buckets instead."""
    keys = [f"many-{i}" for i in range(20_000)]
    assert timeouts.bulk_schedule([item(key) for key in keys]) == len(keys)
    with pytest.raises(timeouts.TaskConflict, match="item 0: test.record:many-0 "):
        timeouts.bulk_schedule([item(key) for key in keys])
    assert timeouts.bulk_schedule([item(key, on_conflict="keep") for key in keys] + [item("one-more")]) == 1
    assert TimeoutTask.objects.count() == len(keys) + 1


def wait_for_lock_wait(pids, timeout=30):
    """Until one of the backends `pids` waits for an advisory lock."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s) AND wait_event_type = 'Lock' "
                           "AND wait_event = 'advisory'", [list(pids)])
            if cursor.fetchone()[0]:
                return
        time.sleep(0.05)
    raise AssertionError("no call waited for the other's lock")


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
@pytest.mark.parametrize("by_bucket", [False, True], ids=["keys", "buckets"])
@pytest.mark.parametrize("first", ["batch", "schedule"])
def test_a_batch_and_a_schedule_of_one_key_wait_for_each_other(first, by_bucket, monkeypatch):
    """Whichever locks the key first holds it until its transaction commits; the other then sees
    its task and conflicts. Batches lock key by key, or (past MAX_KEY_LOCKS keys) bucket by bucket."""
    from timeouts.store import scheduling

    monkeypatch.setattr(scheduling, "MAX_KEY_LOCKS", 2 if by_bucket else 1024)
    calls = {"batch": lambda: timeouts.bulk_schedule([item("a"), item("shared"), item("b")]),
             "schedule": lambda: timeouts.schedule("test.record", "shared", delay=60)}
    second = "schedule" if first == "batch" else "batch"
    holding, release = threading.Event(), threading.Event()
    pids, outcome = {}, {}

    def run(name, hold):
        try:
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_backend_pid()")
                pids[name] = cursor.fetchone()[0]
            with transaction.atomic():
                calls[name]()
                if hold:
                    holding.set()
                    release.wait(30)
            outcome[name] = "stored"
        except timeouts.TaskConflict:
            outcome[name] = "conflict"
        except Exception as exc:  # pragma: no cover - reported below
            outcome[name] = exc
        finally:
            connection.close()

    holder = threading.Thread(target=run, args=(first, True))
    holder.start()
    assert holding.wait(30)
    waiter = threading.Thread(target=run, args=(second, False))
    waiter.start()
    try:
        while second not in pids:
            time.sleep(0.01)
        wait_for_lock_wait([pids[second]])
    finally:
        release.set()
        holder.join(30)
        waiter.join(30)
    assert outcome == {first: "stored", second: "conflict"}
    assert len(waiting("shared")) == 1
