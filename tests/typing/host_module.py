"""Host code that calls every public name of timeouts, written as a strictly typed project writes
it: `mypy --strict` over this module must report nothing (tests/typing/test_mypy.py). It is only
type-checked, never run; assert_type() pins what each call gives back."""

from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, assert_type
from uuid import UUID

from celery import Celery
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.tasks import TaskResult

import timeouts
import timeouts.backends
import timeouts.celery
import timeouts.errors
import timeouts.events
import timeouts.metrics
from timeouts.models import TimeoutTask, TimeoutTaskManager, TimeoutTaskQuerySet
from timeouts.testing import run_due


@timeouts.handler("order.close", queue="orders", max_attempts=3, ttr=30, rate_limit=10.5, concurrency=2)
def close_order(task: TimeoutTask) -> None:
    reason: Any = task.attribute.get("reason")
    lateness: timedelta | None = task.lateness
    print(task.biz_type, task.biz_id, task.status == TimeoutTask.Status.RUNNING, reason, lateness)


@timeouts.handler("order.remind", max_lateness=timedelta(minutes=5), on_late="skip")
async def remind(task: TimeoutTask) -> str:
    return task.biz_id


# The decorator gives the function back as it was.
handlers: tuple[Callable[[TimeoutTask], None], Callable[[TimeoutTask], Awaitable[str]]] = (close_order, remind)


def schedule_and_change(order_id: int, key: UUID) -> None:
    at = datetime.now(UTC) + timedelta(minutes=30)
    assert_type(timeouts.schedule("order.close", order_id, at=at), TimeoutTask)
    assert_type(timeouts.schedule("order.close", key, delay=timedelta(seconds=30), attribute={"reason": "unpaid"},
                                  on_conflict="replace", using="default"), TimeoutTask)
    assert_type(timeouts.schedule("order.close", "o-1", delay=90.5, on_conflict=None), TimeoutTask)
    assert_type(timeouts.schedule("order.close", order_id, delay=timedelta(seconds=30), on_conflict="debounce",
                                  max_wait=timedelta(minutes=5)), TimeoutTask)
    assert_type(timeouts.bulk_schedule([{"biz_type": "order.close", "biz_id": i, "delay": 60} for i in range(3)]),
                int)
    assert_type(timeouts.bulk_schedule((), using="default"), int)
    assert_type(timeouts.cancel("order.close", order_id), bool)
    assert_type(timeouts.cancel("order.close", "o-1", using="default"), bool)
    assert_type(timeouts.reschedule("order.close", order_id, at=at), bool)
    assert_type(timeouts.reschedule("order.close", order_id, delay=timedelta(hours=1), using=None), bool)
    assert_type(timeouts.requeue("order.close", order_id), bool)
    assert_type(timeouts.requeue("order.close", order_id, using="default"), bool)


async def schedule_and_change_async(order_id: int) -> None:
    task = await timeouts.aschedule("order.close", order_id, delay=timedelta(minutes=30), attribute={"n": 1})
    assert_type(task, TimeoutTask)
    assert_type(await timeouts.aschedule("order.close", order_id, delay=timedelta(seconds=30), on_conflict="debounce",
                                         max_wait=None), TimeoutTask)
    assert_type(await timeouts.abulk_schedule([{"biz_type": "order.close", "biz_id": 1, "delay": 5}]), int)
    assert_type(await timeouts.acancel("order.close", order_id), bool)
    assert_type(await timeouts.areschedule("order.close", order_id, delay=60), bool)
    assert_type(await timeouts.arequeue("order.close", order_id, using="default"), bool)


def the_model(task: TimeoutTask) -> None:
    manager = TimeoutTask.objects
    assert_type(manager, TimeoutTaskManager)
    assert_type(manager.schedule("order.close", 1, delay=5), TimeoutTask)
    assert_type(manager.schedule("order.close", 1, delay=5, on_conflict="debounce", max_wait=timedelta(0)), TimeoutTask)
    assert_type(manager.db_manager("default"), TimeoutTaskManager)
    assert_type(manager.db_manager("default").bulk_schedule([{"biz_type": "order.close", "biz_id": 2}]), int)
    assert_type(manager.cancel("order.close", 1), int)
    assert_type(manager.pending(), TimeoutTaskQuerySet)
    assert_type(manager.due().filter(biz_type="order.close"), TimeoutTaskQuerySet)
    assert_type(manager.filter(biz_type="order.close").dead(), TimeoutTaskQuerySet)
    assert_type(manager.dead().first(), TimeoutTask | None)
    pending: QuerySet[TimeoutTask] = manager.pending()
    print(pending)
    assert_type(task.cancel(), bool)
    assert_type(task.reschedule(at=datetime.now(UTC)), bool)
    assert_type(task.reschedule(delay=30), bool)
    assert_type(task.requeue(), bool)
    assert_type(task.lateness, timedelta | None)
    job_id: int = task.job_id
    action_time: datetime = task.action_time
    print(job_id, action_time, task.attempts, task.max_attempts, task.last_error, task.created_at)


def limits_and_pauses() -> None:
    in_force = timeouts.limits("order.close")
    assert_type(in_force, timeouts.Limits)
    rate: float | None = in_force.rate_limit
    concurrency: int | None = in_force.concurrency
    paused: bool = in_force.paused
    max_lateness: timedelta | None = in_force.max_lateness
    on_late: str = in_force.on_late
    print(rate, concurrency, paused, max_lateness, on_late,
          timeouts.Limits(rate_limit=1.0, concurrency=None, paused=False))
    assert_type(timeouts.limits("order.close", using="default"), timeouts.Limits)
    assert_type(timeouts.set_limits("order.close", rate_limit=10, concurrency=None), None)
    assert_type(timeouts.set_limits("order.close", 2.5, 4, using="default"), None)
    assert_type(timeouts.set_limits("order.remind", max_lateness=timedelta(minutes=2), on_late="dead"), None)
    assert_type(timeouts.set_limits("order.remind", max_lateness=None), None)
    assert_type(timeouts.reset_limits("order.close"), None)
    assert_type(timeouts.pause("order.close", using=None), None)
    assert_type(timeouts.resume("order.close"), None)


def errors() -> list[type[timeouts.TimeoutsError]]:
    try:
        timeouts.schedule("order.close", 1, delay=5, on_conflict="error")
    except timeouts.TaskConflict as exc:
        message: str = str(exc)
        print(message)
    except (timeouts.InvalidTime, timeouts.InvalidAttribute, timeouts.InvalidBizId, timeouts.InvalidBizType,
            timeouts.InvalidOption, timeouts.UnknownBizType, timeouts.ShardOutsideTransaction) as exc:
        rejected: timeouts.TimeoutsError = exc
        print(rejected)
    error: ValueError = timeouts.errors.TimeoutsError("bad")
    print(error)
    return [timeouts.errors.TaskConflict, timeouts.errors.UnknownBizType]


app = Celery("host")
timeouts.celery.setup(app)
timeouts.celery.setup(app, beat_queue=None)
entries: dict[str, dict[str, Any]] = timeouts.celery.beat_schedule()


class Charge(timeouts.celery.DurableTask):
    name = "host.charge"
    ttr = 120


def durable_calls(task_id: str) -> None:
    assert_type(timeouts.celery.cancel(task_id), bool)
    result = Charge().apply_async((1,), countdown=1800)
    assert_type(timeouts.celery.cancel(result), bool)


def django_tasks(result: TaskResult[Any, Any]) -> None:
    assert_type(timeouts.backends.cancel(result), bool)
    assert_type(timeouts.backends.cancel(result.id), bool)
    backend: type[timeouts.backends.TimeoutsBackend] = timeouts.backends.TimeoutsBackend
    failures: tuple[type[Exception], ...] = (timeouts.backends.InvalidTaskArguments,
                                            timeouts.backends.InvalidTaskOptions, timeouts.backends.LeaseExpired,
                                            timeouts.backends.Cancelled)
    print(backend, failures)


def on_task_event(sender: object, event: str, biz_type: str, count: int, lateness: float | None,
                  **kwargs: object) -> None:
    print(event in timeouts.events.EVENTS, biz_type, count, lateness)


timeouts.events.task_event.connect(on_task_event)


def a_test() -> None:
    assert_type(run_due(), int)
    assert_type(run_due(until=datetime.now(UTC) + timedelta(hours=1), biz_type="order.close"), int)


def metrics(request: HttpRequest) -> HttpResponse:
    return timeouts.metrics.metrics_view(request)
