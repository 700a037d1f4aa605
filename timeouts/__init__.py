"""timeouts: "at this exact time, do this, durably" for Django and Celery."""

__version__ = "0.1.0"

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any
from uuid import UUID

from asgiref.sync import sync_to_async

from timeouts.errors import (
    InvalidAttribute,
    InvalidBizId,
    InvalidBizType,
    InvalidOption,
    InvalidTime,
    ShardOutsideTransaction,
    TaskConflict,
    TimeoutsError,
    UnknownBizType,
)
from timeouts.limiting.controls import Limits, limits, pause, reset_limits, resume, set_limits
from timeouts.registry import handler
from timeouts.validation import DEFAULT_ON_CONFLICT

if TYPE_CHECKING:
    from timeouts.models import TimeoutTask

__all__ = [
    "handler", "schedule", "bulk_schedule", "cancel", "reschedule", "requeue",
    "aschedule", "abulk_schedule", "acancel", "areschedule", "arequeue",
    "Limits", "limits", "set_limits", "reset_limits", "pause", "resume",
    "TimeoutsError", "InvalidAttribute", "InvalidBizId", "InvalidBizType", "InvalidOption", "InvalidTime",
    "ShardOutsideTransaction", "TaskConflict", "UnknownBizType",
]


def __dir__() -> list[str]:
    # The public names only: not the subpackages that importing them brought in.
    return sorted([*__all__, "__version__"])


# The model cannot be imported before Django's app registry is ready, hence the imports inside.

def schedule(biz_type: str, biz_id: str | int | UUID, *, at: datetime | None = None,
             delay: timedelta | float | None = None, attribute: Mapping[str, Any] | None = None,
             on_conflict: str | None = DEFAULT_ON_CONFLICT, max_wait: timedelta | None = None,
             using: str | None = None) -> "TimeoutTask":
    """Have the handler of `biz_type` run for `biz_id` at `at` (an aware datetime) or after `delay`
    (a timedelta or seconds, added to the database clock); returns the new task.

    `attribute`: a JSON object, handed to the handler as `task.attribute`. `on_conflict`, for a key
    that has a task waiting to run (PENDING or DISPATCHED): "error" raises TaskConflict, "keep"
    returns that task, "replace" cancels it and creates this one, None creates this one beside it.
    "debounce" moves the key's PENDING task to the new time, with this attribute, and returns it
    (else creates this one), never to later than `max_wait` (a timedelta; None: no limit) after
    that task was first scheduled. `using`: the database (shard) of the task; by default the one of
    its key. Inside `transaction.atomic()` the task is part of that transaction. Bad input raises a
    TimeoutsError and stores nothing."""
    from timeouts.models import TimeoutTask

    manager = TimeoutTask.objects if using is None else TimeoutTask.objects.db_manager(using)
    return manager.schedule(biz_type, biz_id, at=at, delay=delay, attribute=attribute, on_conflict=on_conflict,
                            max_wait=max_wait)


def bulk_schedule(items: Iterable[Mapping[str, Any]], *, using: str | None = None) -> int:
    """Schedule many tasks, all or none, from dicts of schedule()'s keyword arguments (`biz_type`
    and `biz_id` included); returns how many tasks it created (a debounced item that moved a waiting
    task created none). Every item is checked before anything is written: an error names the item's
    index. Items of one key meet each other as schedule() calls one after the other would. `using`:
    one database (shard) for all."""
    from timeouts.models import TimeoutTask

    manager = TimeoutTask.objects if using is None else TimeoutTask.objects.db_manager(using)
    return manager.bulk_schedule(items)


def cancel(biz_type: str, biz_id: str | int | UUID, *, using: str | None = None) -> bool:
    """Cancel the tasks of (biz_type, biz_id) that have not started, and discard its DEAD ones.

    True: the key had a task that had not started, and none of its handlers will run. False: it
    had none (nothing scheduled, or everything already started or ended). `using`: the database
    (shard) to look in; by default the one of its key."""
    from timeouts.store import transitions

    _count, stopped = transitions.cancel_by_key(biz_type, biz_id, using=using)
    return stopped


def reschedule(biz_type: str, biz_id: str | int | UUID, *, at: datetime | None = None,
               delay: timedelta | float | None = None, using: str | None = None) -> bool:
    """Move the tasks of (biz_type, biz_id) that have not started to `at` or after `delay`, as
    schedule() takes them. True: one moved; False: the key had none waiting."""
    from timeouts.store import transitions

    return transitions.reschedule_by_key(biz_type, biz_id, at=at, delay=delay, using=using)


def requeue(biz_type: str, biz_id: str | int | UUID, *, using: str | None = None) -> bool:
    """Run the latest task of (biz_type, biz_id) again, now, if it is DEAD or CANCELLED and no
    other task of the key waits to run: it becomes PENDING with its attempts reset. True if it
    did."""
    from timeouts.store import transitions

    return transitions.requeue_by_key(biz_type, biz_id, using=using)


# The async face: each runs its sync function through asgiref's sync_to_async(thread_sensitive=True),
# as Django's async ORM methods do (docs: howto/async).

async def aschedule(biz_type: str, biz_id: str | int | UUID, *, at: datetime | None = None,
                    delay: timedelta | float | None = None, attribute: Mapping[str, Any] | None = None,
                    on_conflict: str | None = DEFAULT_ON_CONFLICT, max_wait: timedelta | None = None,
                    using: str | None = None) -> "TimeoutTask":
    """`schedule()`, awaitable."""
    return await sync_to_async(schedule, thread_sensitive=True)(
        biz_type, biz_id, at=at, delay=delay, attribute=attribute, on_conflict=on_conflict, max_wait=max_wait,
        using=using)


async def abulk_schedule(items: Iterable[Mapping[str, Any]], *, using: str | None = None) -> int:
    """`bulk_schedule()`, awaitable."""
    return await sync_to_async(bulk_schedule, thread_sensitive=True)(items, using=using)


async def acancel(biz_type: str, biz_id: str | int | UUID, *, using: str | None = None) -> bool:
    """`cancel()`, awaitable."""
    return await sync_to_async(cancel, thread_sensitive=True)(biz_type, biz_id, using=using)


async def areschedule(biz_type: str, biz_id: str | int | UUID, *, at: datetime | None = None,
                      delay: timedelta | float | None = None, using: str | None = None) -> bool:
    """`reschedule()`, awaitable."""
    return await sync_to_async(reschedule, thread_sensitive=True)(biz_type, biz_id, at=at, delay=delay, using=using)


async def arequeue(biz_type: str, biz_id: str | int | UUID, *, using: str | None = None) -> bool:
    """`requeue()`, awaitable."""
    return await sync_to_async(requeue, thread_sensitive=True)(biz_type, biz_id, using=using)
