"""Every error the public API raises for bad input derives from `TimeoutsError`.

`TimeoutsError` is a `ValueError`, so callers that already catch `ValueError` around user input keep
working. Each subclass's docstring is its default message.

Misuse by the project itself raises Django's own exceptions: a bad `@timeouts.handler` registration
`django.core.exceptions.ImproperlyConfigured`, and a claim inside a transaction
`django.db.transaction.TransactionManagementError`.
"""

__all__ = ["InvalidAttribute", "InvalidBizId", "InvalidBizType", "InvalidOption", "InvalidTime",
           "ShardOutsideTransaction", "TaskConflict", "TimeoutsError", "UnknownBizType"]


class TimeoutsError(ValueError):
    """The timeouts API rejected its input; nothing was stored."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or self.__doc__)


class InvalidTime(TimeoutsError):
    """Give exactly one of `at` (an aware datetime) or `delay` (a timedelta or seconds)."""


class UnknownBizType(TimeoutsError):
    """No handler is registered for this biz_type."""


class InvalidBizType(TimeoutsError):
    """A biz_type is 1 to 64 characters of [A-Za-z0-9_.:-]."""


class InvalidBizId(TimeoutsError):
    """A biz_id is a non-empty str, int or UUID of at most 255 characters, without NUL."""


class InvalidAttribute(TimeoutsError):
    """An attribute is a JSON object of finite numbers, strings without NUL, lists and objects."""


class InvalidOption(TimeoutsError):
    """An option passed to the timeouts API has a value it does not accept."""


class TaskConflict(TimeoutsError):
    """A task for this (biz_type, biz_id) is already waiting to run (on_conflict="error")."""


class ShardOutsideTransaction(TimeoutsError):
    """The task's shard is not in the caller's transaction: stored there, it would commit on its own,
    whatever became of that transaction. Nothing was stored."""
