"""schedule(..., on_conflict="debounce"): the key's PENDING task moves to the new time, with the new
attribute, never past its first scheduling plus max_wait; a key without one gets a new task; what
is refused stores nothing. bulk_schedule() items and aschedule() the same way."""

from datetime import UTC, datetime, timedelta

import pytest
from asgiref.sync import async_to_sync
from django.db import connection, transaction

import timeouts
from tests.support.factories import move_to
from timeouts.conf import notify_params
from timeouts.models import TimeoutTask
from timeouts.store.queries import fetch_one

Status = TimeoutTask.Status
pytestmark = pytest.mark.django_db

MINUTE = timedelta(minutes=1)


def debounce(biz_id="k", *, delay=MINUTE, **options):
    return timeouts.schedule("test.record", biz_id, delay=delay, on_conflict="debounce", **options)


def reload(task):
    return TimeoutTask.objects.get(job_id=task.job_id)


def pending(biz_id="k"):
    return list(TimeoutTask.objects.pending().filter(biz_id=biz_id))


def about(measured, expected):
    """Within a second: bulk_schedule() reads the clock once for the batch, before its writes."""
    return abs(measured - expected) < timedelta(seconds=1)


def item(biz_id, delay=MINUTE, **options):
    return {"biz_type": "test.record", "biz_id": biz_id, "delay": delay, "on_conflict": "debounce", **options}


def test_a_key_without_a_pending_task_gets_a_new_one():
    task = debounce(attribute={"edit": 1})
    assert reload(task).status == Status.PENDING and task.attribute == {"edit": 1}
    assert MINUTE <= task.action_time - task.created_at < MINUTE + timedelta(seconds=1)


def test_the_pending_task_moves_to_the_new_time_with_the_new_attribute():
    first = debounce(attribute={"edit": 1})
    later = debounce(delay=2 * MINUTE, attribute={"edit": 2})
    assert later.job_id == first.job_id and later.action_time > first.action_time + MINUTE
    stored = reload(first)
    assert (stored.action_time, stored.run_at, stored.attribute) == (later.action_time, later.action_time, {"edit": 2})
    assert stored.created_at == first.created_at and stored.modified_at > first.modified_at
    # Earlier too: the last call's time is the task's.
    sooner = debounce(delay=timedelta(seconds=5))
    assert sooner.job_id == first.job_id and sooner.action_time < first.action_time
    assert [task.job_id for task in pending()] == [first.job_id]


def test_the_moved_task_returned_is_the_stored_row_field_by_field():
    debounce(attribute={"a": 1})
    moved = debounce(attribute={"b": [1e16, 0.1, "x"]})
    stored = reload(moved)
    for field in TimeoutTask._meta.concrete_fields:
        assert getattr(moved, field.attname) == getattr(stored, field.attname), field.name
    assert type(moved.attribute["b"][0]) is type(stored.attribute["b"][0])
    assert moved._state.adding is False and moved._state.db == stored._state.db


def test_an_at_time_moves_the_task_there():
    first = debounce()
    at = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=3)
    moved = timeouts.schedule("test.record", "k", at=at, on_conflict="debounce")
    assert moved.job_id == first.job_id and reload(first).action_time == at


def test_max_wait_caps_the_time_at_the_first_scheduling_plus_max_wait():
    first = debounce(delay=timedelta(seconds=30), max_wait=timedelta(minutes=5))
    for _ in range(3):
        moved = debounce(delay=timedelta(hours=1), max_wait=timedelta(minutes=5))
        assert moved.job_id == first.job_id
        assert moved.action_time == first.created_at + timedelta(minutes=5)
    # Within the cap, the time asked for.
    within = debounce(delay=timedelta(seconds=40), max_wait=timedelta(minutes=5))
    assert timedelta(seconds=40) <= within.action_time - within.modified_at < timedelta(seconds=41)


def test_max_wait_caps_a_new_task_too():
    task = debounce(delay=timedelta(hours=1), max_wait=timedelta(minutes=5))
    # Capped at the call's reading of the clock, just before the insert: at most its created_at.
    assert timedelta(minutes=5) - timedelta(seconds=1) < task.action_time - task.created_at <= timedelta(minutes=5)


def test_without_max_wait_there_is_no_cap_and_a_huge_max_wait_is_none_either():
    first = debounce(delay=timedelta(seconds=30))
    moved = debounce(delay=timedelta(days=400))
    assert moved.job_id == first.job_id and moved.action_time - moved.modified_at >= timedelta(days=400)
    huge = debounce(delay=timedelta(days=500), max_wait=timedelta.max)
    assert huge.action_time - huge.modified_at >= timedelta(days=500)


def age(task, **fields):
    """Move the task's times back, as if it had been scheduled that much earlier."""
    assignments = ", ".join(f"{name} = {name} - %({name})s" for name in fields)
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE timeouts_task SET {assignments} WHERE job_id = %(job_id)s",
                       {**fields, "job_id": task.job_id})
    return reload(task)


def test_an_overdue_task_moves_no_later_than_its_cap():
    """Scheduled two hours ago, due then, still waiting (its dispatcher is behind): a debounce with
    max_wait=1 h leaves it due at its cap, an hour ago, and due at once."""
    first = debounce(delay=timedelta(seconds=30), max_wait=timedelta(hours=1))
    two_hours = timedelta(hours=2)
    first = age(first, created_at=two_hours, action_time=two_hours, run_at=two_hours)
    moved = debounce(max_wait=timedelta(hours=1))
    assert moved.job_id == first.job_id
    assert moved.action_time == first.created_at + timedelta(hours=1)
    assert TimeoutTask.objects.due().filter(job_id=first.job_id).exists()


def test_a_cap_that_passed_long_ago_makes_the_task_due_now_not_then():
    """First scheduled two hours ago without a cap, due in an hour; debounced now with max_wait=1 h:
    its cap passed an hour ago, so it is due now (its lateness counts from now)."""
    first = age(debounce(delay=timedelta(hours=3)), created_at=timedelta(hours=2))
    moved = debounce(max_wait=timedelta(hours=1))
    assert moved.job_id == first.job_id
    assert moved.action_time == moved.modified_at  # the call's reading of the clock
    assert TimeoutTask.objects.due().filter(job_id=first.job_id).exists()


@pytest.mark.parametrize("status", [Status.DISPATCHED, Status.RUNNING, Status.DONE, Status.CANCELLED, Status.DEAD])
def test_a_task_that_is_not_pending_is_left_alone_and_a_new_one_is_created(status):
    """A claimed (DISPATCHED) task may already be on its way to a worker: it runs at its time, and
    the change gets a task of its own."""
    first = move_to(debounce(attribute={"edit": 1}), status)
    second = debounce(attribute={"edit": 2})
    assert second.job_id != first.job_id and second.status == Status.PENDING
    assert reload(first).action_time == first.action_time and reload(first).attribute == {"edit": 1}
    assert [task.job_id for task in pending()] == [second.job_id]


def test_a_retry_waiting_in_pending_is_moved_and_keeps_its_attempts():
    running = move_to(debounce(), Status.RUNNING)
    row = fetch_one("fail_task", {"job_id": running.job_id, "action_time": running.action_time, "attempt": 1,
                                  "error": "boom", "backoff": 3600, **notify_params()}, using=connection)
    assert row["status"] == Status.PENDING
    moved = debounce(delay=timedelta(seconds=10))
    assert moved.job_id == running.job_id and moved.attempts == 1 and moved.run_at == moved.action_time
    assert moved.last_error == "boom"


def test_of_several_pending_tasks_the_first_scheduled_moves():
    first = timeouts.schedule("test.record", "k", delay=MINUTE, on_conflict=None)
    second = timeouts.schedule("test.record", "k", delay=MINUTE / 2, on_conflict=None)
    moved = debounce(delay=3 * MINUTE)
    assert moved.job_id == first.job_id
    assert reload(second).action_time == second.action_time


def test_the_other_modes_see_a_debounced_task_as_waiting():
    task = debounce()
    with pytest.raises(timeouts.TaskConflict, match=str(task.job_id)):
        timeouts.schedule("test.record", "k", delay=MINUTE)
    assert timeouts.schedule("test.record", "k", delay=MINUTE, on_conflict="keep").job_id == task.job_id


def test_a_rolled_back_debounce_leaves_the_task_as_it_was():
    first = debounce(attribute={"edit": 1})
    with pytest.raises(RuntimeError), transaction.atomic():
        assert debounce(delay=2 * MINUTE, attribute={"edit": 2}).job_id == first.job_id
        debounce("other")
        raise RuntimeError("the host's transaction fails")
    stored = reload(first)
    assert (stored.action_time, stored.attribute) == (first.action_time, {"edit": 1})
    assert not pending("other")


def test_inside_a_transaction_the_calls_of_one_key_meet_each_other():
    with transaction.atomic():
        first = debounce()
        moved = debounce(delay=2 * MINUTE)
    assert moved.job_id == first.job_id and len(pending()) == 1


@pytest.mark.parametrize("options, message", [
    (dict(max_wait=MINUTE), 'max_wait is for on_conflict="debounce", not on_conflict=\'error\''),
    (dict(max_wait=MINUTE, on_conflict=None), "not on_conflict=None"),
    (dict(max_wait=MINUTE, on_conflict="replace"), "not on_conflict='replace'"),
    (dict(max_wait=300, on_conflict="debounce"), "max_wait must be a timedelta or None, got 300"),
    (dict(max_wait="5m", on_conflict="debounce"), "got '5m'"),
    (dict(max_wait=-MINUTE, on_conflict="debounce"), "must not be negative"),
    (dict(on_conflict="Debounce"), '"keep" or "debounce"'),
])
def test_a_bad_max_wait_or_on_conflict_is_refused_and_stores_nothing(options, message):
    with pytest.raises(timeouts.InvalidOption, match=message):
        timeouts.schedule("test.record", "k", delay=MINUTE, **options)
    with pytest.raises(timeouts.InvalidOption, match="item 0: "):
        timeouts.bulk_schedule([{"biz_type": "test.record", "biz_id": "k", "delay": MINUTE, **options}])
    assert TimeoutTask.objects.count() == 0


def test_a_zero_max_wait_keeps_the_task_at_its_first_scheduling():
    task = debounce(max_wait=timedelta(0))
    assert task.action_time <= task.created_at
    assert debounce(max_wait=timedelta(0)).action_time == task.action_time


# --- bulk_schedule() ---------------------------------------------------------------------------------

def test_bulk_items_move_the_pending_tasks_of_their_keys_and_create_the_others():
    a = debounce("a", attribute={"v": 0})
    dispatched = move_to(debounce("d"), Status.DISPATCHED)
    created = timeouts.bulk_schedule([item("a", 2 * MINUTE, attribute={"v": 1}), item("b"),
                                      item("d", attribute={"v": 3}), item("a", 3 * MINUTE, attribute={"v": 2})])
    assert created == 2  # b, and a new task beside d's claimed one
    moved = reload(a)
    assert moved.attribute == {"v": 2} and about(moved.action_time - moved.modified_at, 3 * MINUTE)
    assert len(pending("a")) == 1 and len(pending("b")) == 1
    assert reload(dispatched).status == Status.DISPATCHED and pending("d")[0].attribute == {"v": 3}


def test_items_of_one_key_in_a_batch_give_it_one_task_with_the_last_time_and_attribute():
    assert timeouts.bulk_schedule([item("k", MINUTE, attribute={"v": 1}), item("other"),
                                   item("k", 5 * MINUTE, attribute={"v": 2}),
                                   item("k", 2 * MINUTE, attribute={"v": 3})]) == 2
    [task] = pending()
    assert task.attribute == {"v": 3} and about(task.action_time - task.created_at, 2 * MINUTE)


def test_bulk_max_wait_caps_moves_and_new_tasks():
    first = debounce("stored", delay=timedelta(seconds=30))
    timeouts.bulk_schedule([item("stored", timedelta(hours=1), max_wait=timedelta(minutes=5)),
                            item("new", timedelta(hours=1), max_wait=timedelta(minutes=5)),
                            item("new", timedelta(hours=2), max_wait=timedelta(minutes=5))])
    assert reload(first).action_time == first.created_at + timedelta(minutes=5)
    [new] = pending("new")
    assert timedelta(minutes=5) - timedelta(seconds=1) < new.action_time - new.created_at <= timedelta(minutes=5)


def test_bulk_modes_meet_a_debounced_key_as_schedule_calls_would():
    first = debounce("k")
    # "replace" after a debounce cancels the task the debounce moved, and creates its own.
    assert timeouts.bulk_schedule([item("k", 2 * MINUTE), item("k", on_conflict="replace")]) == 1
    assert reload(first).status == Status.CANCELLED
    [replacement] = pending()
    assert replacement.job_id != first.job_id
    with pytest.raises(timeouts.TaskConflict, match="item 1: "):
        timeouts.bulk_schedule([item("k"), item("k", on_conflict="error")])
    assert reload(replacement).action_time == replacement.action_time  # the failed batch moved nothing


def test_abulk_and_aschedule_take_max_wait():
    first = async_to_sync(timeouts.aschedule)("test.record", "k", delay=timedelta(seconds=30),
                                               on_conflict="debounce", max_wait=timedelta(minutes=5))
    moved = async_to_sync(timeouts.aschedule)("test.record", "k", delay=timedelta(hours=1),
                                               on_conflict="debounce", max_wait=timedelta(minutes=5))
    assert moved.job_id == first.job_id and moved.action_time == first.created_at + timedelta(minutes=5)
    assert async_to_sync(timeouts.abulk_schedule)([item("k", max_wait=timedelta(minutes=1))]) == 0
    assert reload(first).action_time == first.created_at + timedelta(minutes=1)
