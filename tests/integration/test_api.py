"""The public ORM API: schedule, bulk_schedule, cancel, reschedule, requeue, querysets."""

import threading
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction
from django.db.models.signals import post_init

import timeouts
from tests.support.factories import make_task, move_to
from timeouts import registry
from timeouts.backends import queues as tasks_queues
from timeouts.durable.calls import biz_type_for
from timeouts.models import TimeoutTask

Status = TimeoutTask.Status
pytestmark = pytest.mark.django_db


def in_an_hour():
    return datetime.now(UTC) + timedelta(hours=1)


def test_schedule_at_stores_every_field():
    at = in_an_hour()
    task = TimeoutTask.objects.schedule("test.record", 42, at=at, attribute={"reason": "unpaid", "n": [1, 2.5, None]})
    stored = TimeoutTask.objects.get(job_id=task.job_id, action_time=task.action_time)
    assert (stored.biz_type, stored.biz_id, stored.status) == ("test.record", "42", Status.PENDING)
    assert stored.action_time == at and stored.run_at == at
    assert stored.attribute == {"reason": "unpaid", "n": [1, 2.5, None]} == task.attribute
    assert (stored.attempts, stored.max_attempts, stored.ttr) == (0, 16, 60)
    assert stored.created_at is not None and stored.started_at is None


@pytest.mark.parametrize("when", [{"at": "in an hour"}, {"delay": 30}])
def test_the_returned_task_is_the_stored_row_field_by_field(when):
    """schedule() returns the row without reading it back: what the database decided comes from
    RETURNING, the rest from the call. Either way it must equal what a query finds."""
    when = {"at": in_an_hour()} if "at" in when else when
    task = TimeoutTask.objects.schedule("test.slow", 7, attribute={"b": 1, "a": [1e16, 0.1, "x"]}, **when)
    stored = TimeoutTask.objects.get(job_id=task.job_id, action_time=task.action_time)
    for field in TimeoutTask._meta.concrete_fields:
        assert getattr(task, field.attname) == getattr(stored, field.attname), field.name
    assert type(task.attribute["a"][0]) is type(stored.attribute["a"][0])  # as jsonb gives it back
    assert task._state.adding is False and task._state.db == stored._state.db


def test_a_task_without_attribute_is_the_stored_row_and_model_signals_still_see_it():
    """With no receiver of Model's init signals, schedule() sets the returned task's fields itself:
    it must hold what the ORM's own instance holds; with one, the receiver sees the task."""
    task = TimeoutTask.objects.schedule("test.slow", 8, delay=30)
    stored = TimeoutTask.objects.get(job_id=task.job_id, action_time=task.action_time)
    assert task.__dict__.keys() == stored.__dict__.keys()
    for field in TimeoutTask._meta.concrete_fields:
        assert getattr(task, field.attname) == getattr(stored, field.attname), field.name
    assert task.attribute == {} and task._state.adding is False and task._state.db == stored._state.db
    seen = []

    def receiver(sender, instance, **kwargs):
        seen.append(instance)

    post_init.connect(receiver, sender=TimeoutTask)
    try:
        again = TimeoutTask.objects.schedule("test.slow", 9, delay=30)
    finally:
        post_init.disconnect(receiver, sender=TimeoutTask)
    assert any(instance is again for instance in seen)


def test_schedule_delay_is_added_to_the_database_clock():
    task = TimeoutTask.objects.schedule("test.record", "a", delay=timedelta(minutes=30))
    assert timedelta(minutes=30) <= task.action_time - task.created_at < timedelta(minutes=30, seconds=1)
    seconds = TimeoutTask.objects.schedule("test.record", "b", delay=90.5)
    assert timedelta(seconds=90.5) <= seconds.action_time - seconds.created_at < timedelta(seconds=91)


def test_biz_id_is_normalised_with_str():
    key = uuid.uuid4()
    assert TimeoutTask.objects.schedule("test.record", key, delay=60).biz_id == str(key)
    assert TimeoutTask.objects.schedule("test.record", 7, delay=60).biz_id == "7"


def test_handler_settings_become_row_defaults():
    task = TimeoutTask.objects.schedule("test.fail", 1, delay=60)
    assert task.max_attempts == 2
    assert TimeoutTask.objects.schedule("test.slow", 1, delay=60).ttr == 3


def test_past_and_far_future_times_are_accepted():
    past = TimeoutTask.objects.schedule("test.record", 1, at=datetime(2001, 1, 1, tzinfo=UTC))
    future = TimeoutTask.objects.schedule("test.record", 2, at=datetime(9000, 1, 1, tzinfo=UTC))
    assert list(TimeoutTask.objects.due()) == [past]
    assert TimeoutTask.objects.pending().count() == 2 and future.action_time.year == 9000


def test_package_level_functions():
    task = timeouts.schedule("test.record", 5, delay=60)
    assert timeouts.bulk_schedule([{"biz_type": "test.record", "biz_id": 6, "delay": 60}]) == 1
    assert timeouts.cancel("test.record", 5) is True
    task.refresh_from_db()
    assert task.status == Status.CANCELLED
    assert timeouts.cancel("test.record", 5) is False


BAD_INPUT = [
    (timeouts.InvalidTime, dict(at=datetime(2030, 1, 1))),
    (timeouts.InvalidTime, dict()),
    (timeouts.InvalidTime, dict(at=in_an_hour(), delay=5)),
    (timeouts.InvalidTime, dict(delay=float("nan"))),
    (timeouts.InvalidTime, dict(delay="5")),
    (timeouts.InvalidTime, dict(at="2030-01-01T00:00:00Z")),
    (timeouts.InvalidAttribute, dict(delay=5, attribute=[1, 2])),
    (timeouts.InvalidAttribute, dict(delay=5, attribute={"x": float("inf")})),
    (timeouts.InvalidAttribute, dict(delay=5, attribute={"x": "a\x00b"})),
    (timeouts.InvalidAttribute, dict(delay=5, attribute={"a\x00": 1})),
    (timeouts.InvalidAttribute, dict(delay=5, attribute={1: "int key"})),
    (timeouts.InvalidAttribute, dict(delay=5, attribute={"t": (1, 2)})),
    (timeouts.InvalidAttribute, dict(delay=5, attribute={"d": datetime.now(UTC)})),
    (timeouts.InvalidAttribute, dict(delay=5, attribute={"big": "x" * 70_000})),
    (timeouts.InvalidOption, dict(delay=5, on_conflict="merge")),
]


@pytest.mark.parametrize("error, kwargs", BAD_INPUT)
def test_bad_input_raises_a_typed_error_and_stores_nothing(error, kwargs):
    with pytest.raises(error) as raised:
        TimeoutTask.objects.schedule("test.record", 1, **kwargs)
    assert isinstance(raised.value, timeouts.TimeoutsError) and isinstance(raised.value, ValueError)
    assert str(raised.value)
    assert TimeoutTask.objects.count() == 0


def test_deeply_nested_attribute_is_rejected():
    deep = {}
    for _ in range(2000):
        deep = {"x": deep}
    with pytest.raises(timeouts.InvalidAttribute, match="nested deeper"):
        TimeoutTask.objects.schedule("test.record", 1, delay=5, attribute=deep)


@pytest.mark.parametrize("biz_id", ["", "x" * 256, None, 1.5, True, "a\x00"])
def test_bad_biz_id(biz_id):
    with pytest.raises(timeouts.InvalidBizId):
        TimeoutTask.objects.schedule("test.record", biz_id, delay=5)
    assert TimeoutTask.objects.count() == 0


def test_unknown_and_malformed_biz_type():
    with pytest.raises(timeouts.UnknownBizType, match="no handler"):
        TimeoutTask.objects.schedule("no.such.handler", 1, delay=5)
    with pytest.raises(timeouts.InvalidBizType):
        TimeoutTask.objects.schedule("has space", 1, delay=5)
    with pytest.raises(timeouts.InvalidBizType):
        TimeoutTask.objects.schedule("x" * 65, 1, delay=5)
    assert TimeoutTask.objects.count() == 0


def test_on_conflict():
    first = TimeoutTask.objects.schedule("test.record", 1, delay=60, on_conflict="error")
    with pytest.raises(timeouts.TaskConflict, match=str(first.job_id)):
        TimeoutTask.objects.schedule("test.record", 1, delay=30, on_conflict="error")
    kept = TimeoutTask.objects.schedule("test.record", 1, delay=30, on_conflict="keep")
    assert kept.job_id == first.job_id
    replacement = TimeoutTask.objects.schedule("test.record", 1, delay=30, on_conflict="replace")
    first.refresh_from_db()
    assert first.status == Status.CANCELLED and replacement.status == Status.PENDING
    assert TimeoutTask.objects.pending().filter(biz_id="1").count() == 1
    # None: always a new task, whatever exists.
    TimeoutTask.objects.schedule("test.record", 1, delay=30, on_conflict=None)
    assert TimeoutTask.objects.pending().filter(biz_id="1").count() == 2


@pytest.mark.parametrize("schedule", [timeouts.schedule, TimeoutTask.objects.schedule])
def test_a_key_that_has_a_waiting_task_is_refused_by_default(schedule):
    first = schedule("test.record", 1, delay=60)
    with pytest.raises(timeouts.TaskConflict, match=str(first.job_id)):
        schedule("test.record", 1, delay=30)
    assert list(TimeoutTask.objects.values_list("job_id", flat=True)) == [first.job_id]
    # Waiting means not started: once it ran (or ended otherwise), the key takes a new task.
    move_to(first, Status.DONE)
    assert schedule("test.record", 1, delay=30).job_id != first.job_id


@pytest.mark.django_db(transaction=True)
@pytest.mark.timeout(60)
@pytest.mark.parametrize("mode", ["error", "keep", "replace"])
def test_on_conflict_is_race_free_across_connections(mode):
    keys = [f"k{i}" for i in range(150)]
    barrier = threading.Barrier(4)
    errors = []

    def schedule_all():
        try:
            barrier.wait()
            for key in keys:
                try:
                    TimeoutTask.objects.schedule("test.record", key, delay=60, on_conflict=mode)
                except timeouts.TaskConflict:
                    pass
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=schedule_all) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    waiting = TimeoutTask.objects.filter(status__in=[Status.PENDING, Status.DISPATCHED])
    assert waiting.count() == len(keys) == waiting.values("biz_id").distinct().count()


def test_rolled_back_scheduling_leaves_nothing():
    with pytest.raises(RuntimeError), transaction.atomic():
        TimeoutTask.objects.schedule("test.record", 1, delay=0)
        TimeoutTask.objects.bulk_schedule([{"biz_type": "test.record", "biz_id": 2, "delay": 0}])
        raise RuntimeError("the host's transaction fails")
    assert TimeoutTask.objects.count() == 0


def test_bulk_schedule():
    at = in_an_hour()
    items = [{"biz_type": "test.record", "biz_id": i, "at": at + timedelta(seconds=i), "attribute": {"i": i}}
             for i in range(300)]
    items.append({"biz_type": "test.record", "biz_id": "d", "delay": timedelta(minutes=5)})
    assert TimeoutTask.objects.bulk_schedule(iter(items)) == 301
    task = TimeoutTask.objects.get(biz_id="299")
    assert task.attribute == {"i": 299} and task.action_time == at + timedelta(seconds=299)
    assert TimeoutTask.objects.bulk_schedule([]) == 0


def test_bulk_schedule_is_all_or_nothing_and_names_the_bad_item():
    items = [{"biz_type": "test.record", "biz_id": i, "delay": 5} for i in range(10)]
    items[7]["attribute"] = {"x": float("nan")}
    with pytest.raises(timeouts.InvalidAttribute, match="item 7"):
        TimeoutTask.objects.bulk_schedule(items)
    with pytest.raises(timeouts.TimeoutsError, match="item 0"):
        TimeoutTask.objects.bulk_schedule([{"biz_type": "test.record", "biz_id": 1, "when": 5}])
    with pytest.raises(timeouts.TimeoutsError, match="item 0"):
        TimeoutTask.objects.bulk_schedule(["not a dict"])
    for not_a_list in (None, 42, "abc", {"biz_type": "test.record", "biz_id": 1, "delay": 5}):
        with pytest.raises(timeouts.TimeoutsError, match="iterable of dicts"):
            TimeoutTask.objects.bulk_schedule(not_a_list)
    assert TimeoutTask.objects.count() == 0


def test_bulk_schedule_with_on_conflict():
    items = [{"biz_type": "test.record", "biz_id": "same", "delay": 60, "on_conflict": "keep"} for _ in range(3)]
    items.append({"biz_type": "test.record", "biz_id": "other", "delay": 60})
    assert TimeoutTask.objects.bulk_schedule(items) == 2
    assert TimeoutTask.objects.filter(biz_id="same").count() == 1


def test_cancel():
    task = TimeoutTask.objects.schedule("test.record", 1, delay=60)
    assert task.cancel() is True
    assert task.status == Status.CANCELLED and task.finished_at is not None
    assert task.cancel() is False
    assert TimeoutTask.objects.get(job_id=task.job_id).status == Status.CANCELLED


def test_cancel_of_started_or_finished_task_is_false():
    for status in (Status.RUNNING, Status.DONE):
        task = TimeoutTask.objects.schedule("test.record", status.label, delay=60)
        move_to(task, status)
        assert task.cancel() is False
        assert task.status == status


def test_cancel_by_key_counts():
    for _ in range(3):
        TimeoutTask.objects.schedule("test.record", "k", delay=60, on_conflict=None)
    TimeoutTask.objects.schedule("test.record", "other", delay=60)
    assert TimeoutTask.objects.cancel("test.record", "k") == 3
    assert TimeoutTask.objects.cancel("test.record", "k") == 0
    assert TimeoutTask.objects.pending().count() == 1


@pytest.fixture
def orphaned():
    """A PENDING task of a biz_type whose handler is gone from the code: no process knows it."""
    registry.handler("test.orphaned")(lambda task: None)
    try:
        task = TimeoutTask.objects.schedule("test.orphaned", "k", delay=60)
    finally:
        registry.unregister("test.orphaned")
    return task


@pytest.mark.parametrize("cancel", [timeouts.cancel, TimeoutTask.objects.cancel,
                                    TimeoutTask.objects.db_manager("default").cancel])
def test_cancel_of_an_unknown_biz_type_is_refused_and_changes_nothing(cancel, orphaned):
    """A typo on the cancel path must not look like "nothing to cancel": the task would run."""
    TimeoutTask.objects.schedule("test.record", "k", delay=60)
    for typo in ("test.recrod", "test.orphaned"):
        with pytest.raises(timeouts.UnknownBizType, match=typo):
            cancel(typo, "k")
    with pytest.raises(timeouts.InvalidBizType):
        cancel("not a biz type", "k")
    assert sorted(TimeoutTask.objects.pending().values_list("biz_type", flat=True)) == ["test.orphaned", "test.record"]
    assert cancel("test.record", "k") == (True if cancel is timeouts.cancel else 1)


def test_cancel_accepts_the_biz_types_of_durable_calls_and_django_tasks():
    """Any Celery task may be a DurableTask, and this process need not know them all; the same goes
    for the queues of Django's tasks framework."""
    assert timeouts.cancel(biz_type_for("tests.not_bound_here"), "k") is False
    assert timeouts.cancel(tasks_queues.biz_type_for("elsewhere", "default"), "k") is False


def test_reschedule_moves_the_task_across_partitions():
    task = TimeoutTask.objects.schedule("test.record", 1, delay=60)
    later = datetime.now(UTC) + timedelta(days=3)
    assert task.reschedule(at=later) is True
    assert task.action_time == later == task.run_at
    stored = TimeoutTask.objects.get(job_id=task.job_id)
    assert stored.action_time == later and stored.status == Status.PENDING
    assert task.reschedule(delay=5) is True and task.action_time < later
    assert task.cancel() is True
    assert task.reschedule(delay=5) is False
    with pytest.raises(timeouts.InvalidTime):
        task.reschedule()


def test_requeue_dead_or_cancelled():
    task = TimeoutTask.objects.schedule("test.record", 1, delay=3600)
    assert task.requeue() is False  # PENDING: nothing to requeue
    task.cancel()
    assert task.requeue() is True
    assert task.status == Status.PENDING and task.attempts == 0 and task.finished_at is None
    assert list(TimeoutTask.objects.due()) == [task]


def test_querysets():
    TimeoutTask.objects.schedule("test.record", "due", delay=-1)
    TimeoutTask.objects.schedule("test.record", "later", delay=3600)
    make_task(Status.DEAD, biz_id="dead", delay=-1)
    assert [t.biz_id for t in TimeoutTask.objects.due()] == ["due"]
    assert TimeoutTask.objects.pending().count() == 2
    assert [t.biz_id for t in TimeoutTask.objects.dead()] == ["dead"]
