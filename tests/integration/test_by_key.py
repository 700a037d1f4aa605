"""cancel, reschedule and requeue by business key: `timeouts.cancel(biz_type, biz_id)` and its two
siblings, their answers, and what they refuse."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import transaction

import timeouts
from tests.support.factories import make_task, move_to
from timeouts.models import TimeoutTask

Status = TimeoutTask.Status
pytestmark = pytest.mark.django_db


def reload(task):
    return TimeoutTask.objects.get(job_id=task.job_id)


def test_cancel_is_true_when_a_handler_was_stopped():
    task = timeouts.schedule("test.record", "k", delay=60)
    assert timeouts.cancel("test.record", "k") is True
    assert reload(task).status == Status.CANCELLED
    assert timeouts.cancel("test.record", "k") is False  # nothing waits any more
    assert timeouts.cancel("test.record", "never-scheduled") is False


@pytest.mark.parametrize("status", [Status.DISPATCHED, Status.PENDING])
def test_cancel_stops_every_waiting_task_of_the_key(status):
    first = make_task(status, biz_id="k")
    second = TimeoutTask.objects.schedule("test.record", "k", delay=60, on_conflict=None)
    other = TimeoutTask.objects.schedule("test.record", "other", delay=60)
    assert timeouts.cancel("test.record", "k") is True
    assert {reload(first).status, reload(second).status} == {Status.CANCELLED}
    assert reload(other).status == Status.PENDING


@pytest.mark.parametrize("status", [Status.RUNNING, Status.DONE])
def test_cancel_of_a_key_whose_task_started_is_false(status):
    task = make_task(status, biz_id="k")
    assert timeouts.cancel("test.record", "k") is False
    assert reload(task).status == status


def test_cancel_discards_a_dead_task_but_is_true_only_for_one_that_had_not_started():
    dead = make_task(Status.DEAD, biz_id="k")
    assert timeouts.cancel("test.record", "k") is False  # its handler ran; it will not run again either way
    assert reload(dead).status == Status.CANCELLED
    dead_too = make_task(Status.DEAD, biz_id="k2")
    waiting = TimeoutTask.objects.schedule("test.record", "k2", delay=60)
    assert TimeoutTask.objects.cancel("test.record", "k2") == 2  # the manager counts both
    assert {reload(dead_too).status, reload(waiting).status} == {Status.CANCELLED}


def test_cancel_inside_a_rolled_back_transaction_changes_nothing():
    task = timeouts.schedule("test.record", "k", delay=60)
    with pytest.raises(RuntimeError), transaction.atomic():
        assert timeouts.cancel("test.record", "k") is True
        raise RuntimeError("the host's transaction fails")
    assert reload(task).status == Status.PENDING


def test_reschedule_moves_the_waiting_task_of_the_key():
    task = timeouts.schedule("test.record", "k", delay=60)
    later = datetime.now(UTC) + timedelta(days=3)
    assert timeouts.reschedule("test.record", "k", at=later) is True
    moved = reload(task)
    assert (moved.status, moved.action_time, moved.run_at) == (Status.PENDING, later, later)
    assert timeouts.reschedule("test.record", "k", delay=timedelta(seconds=30)) is True
    moved = reload(task)
    assert moved.action_time < later
    assert abs(moved.action_time - moved.modified_at - timedelta(seconds=30)) < timedelta(seconds=1)  # database clock
    assert timeouts.reschedule("test.record", "k", delay=5.5) is True


def test_reschedule_takes_a_dispatched_task_back_and_leaves_started_ones_alone():
    dispatched = make_task(Status.DISPATCHED, biz_id="k")
    assert timeouts.reschedule("test.record", "k", delay=60) is True
    assert reload(dispatched).status == Status.PENDING and reload(dispatched).lease_until is None
    running = make_task(Status.RUNNING, biz_id="r")
    assert timeouts.reschedule("test.record", "r", delay=60) is False
    assert reload(running).status == Status.RUNNING
    assert timeouts.reschedule("test.record", "nothing", delay=60) is False


def test_reschedule_checks_its_time_before_anything():
    task = timeouts.schedule("test.record", "k", delay=60)
    for bad in ({}, {"at": datetime(2030, 1, 1)}, {"at": datetime.now(UTC), "delay": 5}, {"delay": "5"}):
        with pytest.raises(timeouts.InvalidTime):
            timeouts.reschedule("test.record", "k", **bad)
    assert reload(task).action_time == task.action_time


def test_requeue_brings_back_the_latest_task_of_the_key_if_it_ended_without_running():
    dead = make_task(Status.DEAD, biz_id="k")
    assert timeouts.requeue("test.record", "k") is True
    back = reload(dead)
    assert (back.status, back.attempts, back.finished_at) == (Status.PENDING, 0, None)
    assert list(TimeoutTask.objects.due()) == [back]
    assert timeouts.requeue("test.record", "k") is False  # it waits already
    assert timeouts.cancel("test.record", "k") is True
    assert timeouts.requeue("test.record", "k") is True
    assert reload(dead).status == Status.PENDING


def test_requeue_leaves_older_tasks_of_the_key_as_they_ended():
    replaced = timeouts.schedule("test.record", "k", delay=60)
    latest = timeouts.schedule("test.record", "k", delay=60, on_conflict="replace")
    assert reload(replaced).status == Status.CANCELLED
    assert timeouts.requeue("test.record", "k") is False  # the latest waits
    move_to(latest, Status.DONE)
    assert timeouts.requeue("test.record", "k") is False  # the latest ran: nothing to bring back
    assert reload(replaced).status == Status.CANCELLED


def test_requeue_does_not_add_a_second_waiting_task_to_a_key():
    waiting = TimeoutTask.objects.schedule("test.record", "k", delay=60)
    cancelled = TimeoutTask.objects.schedule("test.record", "k", delay=60, on_conflict=None)
    assert cancelled.cancel() is True
    assert timeouts.requeue("test.record", "k") is False
    assert (reload(waiting).status, reload(cancelled).status) == (Status.PENDING, Status.CANCELLED)


@pytest.mark.parametrize("call", [
    lambda biz_type: timeouts.cancel(biz_type, "k"),
    lambda biz_type: timeouts.reschedule(biz_type, "k", delay=5),
    lambda biz_type: timeouts.requeue(biz_type, "k"),
], ids=["cancel", "reschedule", "requeue"])
def test_an_unknown_biz_type_is_refused_and_changes_nothing(call):
    """A typo must not look like "nothing to do": the task would run, or not, unlike what was meant."""
    task = make_task(Status.DEAD, biz_id="k")
    with pytest.raises(timeouts.UnknownBizType, match="test.recrod"):
        call("test.recrod")
    with pytest.raises(timeouts.InvalidBizType):
        call("not a biz type")
    with pytest.raises(timeouts.InvalidBizId):
        timeouts.cancel("test.record", "")
    assert reload(task).status == Status.DEAD


def test_the_biz_types_of_durable_calls_and_django_tasks_are_known():
    from timeouts.backends import queues as tasks_queues
    from timeouts.durable.calls import biz_type_for

    for biz_type in (biz_type_for("tests.not_bound_here"), tasks_queues.biz_type_for("elsewhere", "default")):
        assert timeouts.cancel(biz_type, "k") is False
        assert timeouts.reschedule(biz_type, "k", delay=5) is False
        assert timeouts.requeue(biz_type, "k") is False


def test_using_names_the_database():
    task = timeouts.schedule("test.record", "k", delay=60, using="default")
    assert task._state.db == "default"
    assert timeouts.reschedule("test.record", "k", delay=120, using="default") is True
    assert timeouts.cancel("test.record", "k", using="default") is True
    assert timeouts.requeue("test.record", "k", using="default") is True
    assert timeouts.bulk_schedule([{"biz_type": "test.record", "biz_id": "b", "delay": 5}], using="default") == 1
