"""cancel(result_id): the fenced cancel of a task that has not started."""

from typing import Protocol

from timeouts.backends import results
from timeouts.backends.queues import PREFIX
from timeouts.storage import shards
from timeouts.store import transitions


class _Identified(Protocol):
    """What carries a result id: the TaskResult of Django's tasks framework."""

    @property
    def id(self) -> str: ...


def cancel(result_id: str | _Identified) -> bool:
    """Cancel the task of `result_id` (a TaskResult or its id) if it has not started: True means it
    never runs, and its result reads FAILED (errors end with `timeouts.backends.Cancelled`). False:
    it has started (or ended), or there is no such task. Inside `transaction.atomic()` the cancel
    is part of that transaction. What is no result id of this backend at all raises
    TaskResultDoesNotExist."""
    result_id = getattr(result_id, "id", result_id)
    key = results.parse_result_id(result_id)
    return transitions.cancel_backend_task(key, PREFIX, shards.alias_of_job(key["job_id"]))
