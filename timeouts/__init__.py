"""timeouts: "at this exact time, do this, durably" for Django and Celery."""

__version__ = "0.1.0"

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

__all__ = [
    "handler", "schedule", "bulk_schedule", "cancel",
    "Limits", "limits", "set_limits", "reset_limits", "pause", "resume",
    "TimeoutsError", "InvalidAttribute", "InvalidBizId", "InvalidBizType", "InvalidOption", "InvalidTime",
    "ShardOutsideTransaction", "TaskConflict", "UnknownBizType",
]


# The model cannot be imported before Django's app registry is ready, hence these thin functions.
def schedule(biz_type, biz_id, **kwargs):
    """`TimeoutTask.objects.schedule()`: the handler of `biz_type` runs for `biz_id` at `at=` (an
    aware datetime) or after `delay=` (a timedelta or seconds); returns the task."""
    from timeouts.models import TimeoutTask

    return TimeoutTask.objects.schedule(biz_type, biz_id, **kwargs)


def bulk_schedule(items):
    """`TimeoutTask.objects.bulk_schedule()`: many tasks in one transaction, from dicts with
    schedule()'s keys; returns how many."""
    from timeouts.models import TimeoutTask

    return TimeoutTask.objects.bulk_schedule(items)


def cancel(biz_type, biz_id):
    """`TimeoutTask.objects.cancel()`: cancels every task of (biz_type, biz_id) that has not started;
    returns how many. Their handlers never run. A biz_type with no handler raises UnknownBizType."""
    from timeouts.models import TimeoutTask

    return TimeoutTask.objects.cancel(biz_type, biz_id)
