"""`TimeoutsBackend`: a backend for Django's tasks framework whose tasks are timeout tasks.

    TASKS = {"default": {"BACKEND": "timeouts.backends.TimeoutsBackend", "QUEUES": ["default"],
                         "OPTIONS": {"MAX_ATTEMPTS": 1}}}

enqueue() inserts a row (in the caller's transaction, if any: then on a shard that transaction
holds) due at the task's run_after, or now; the dispatcher or the scan hands it to a Celery worker
on the queue's Celery queue (queues.py), where execution.py runs it behind the usual
compare-and-set and records its result in the row. get_result() reads that row by the key its id
names (results.py).
"""

from collections.abc import Mapping, Sequence
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction

from timeouts import events, validation
from timeouts.backends import queues as tasks_queues
from timeouts.backends import results
from timeouts.backends.compat import (
    BaseTaskBackend,
    InvalidTask,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
    task_enqueued,
)
from timeouts.backends.errors import InvalidTaskArguments, InvalidTaskOptions
from timeouts.conf import get_settings
from timeouts.errors import InvalidAttribute
from timeouts.models import TimeoutTask
from timeouts.storage import shards
from timeouts.store.queries import fetch_one
from timeouts.store.scheduling import NewTask, insert

if TYPE_CHECKING:
    from django.tasks import Task

# The attribute's format, so that a later version can read the tasks an older one stored.
FORMAT = 1
# A biz_id is at most 255 characters: the task's path, shown and searched in the admin.
MAX_BIZ_ID = 255


class TimeoutsBackend(BaseTaskBackend):
    """Django's tasks as timeout tasks: durable, run by Celery workers at their run_after with the
    dispatcher's lateness, retried with timeouts' backoff up to OPTIONS["MAX_ATTEMPTS"] attempts."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    # Tasks due together start in the order they became due (run_at), whatever their priority.
    supports_priority = False

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        self.settings = tasks_queues.options(alias, params)
        self.max_attempts = self.settings.max_attempts
        self.ttr = self.settings.ttr
        # Here too, for a backend configured after start-up (override_settings in tests).
        tasks_queues.register(self.settings)

    def validate_task(self, task: "Task") -> None:
        try:
            super().validate_task(task)
        except InvalidTaskOptions:
            raise
        except InvalidTask as exc:
            message = str(exc)
            if task.queue_name not in self.queues:
                message += f" Backend {self.alias!r} serves the queues {', '.join(sorted(self.queues))} (QUEUES)."
            raise InvalidTaskOptions(message) from None

    def enqueue(self, task: "Task", args: Sequence[Any], kwargs: Mapping[str, Any]) -> TaskResult:
        self.validate_task(task)
        new, call = self._new_task(task, args, kwargs)
        # Any shard will do (the result id names it): inside the caller's transaction, one it holds.
        where = shards.anywhere(f"the task {task.module_path}")
        connection = connections[where.alias]
        row = events.scheduled(insert(TimeoutTask, new, where, connection), where.alias)
        result = TaskResult(
            task=task, id=results.result_id(row.job_id, row.action_time), status=TaskResultStatus.READY,
            enqueued_at=row.created_at, started_at=None, finished_at=None, last_attempted_at=None,
            args=call["args"], kwargs=call["kwargs"], backend=self.alias, errors=[], worker_ids=[])
        send = partial(task_enqueued.send, type(self), task_result=result)
        if connection.in_atomic_block:
            transaction.on_commit(send, using=where.alias)  # a rolled-back task was never enqueued
        else:
            send()
        return result

    def _new_task(self, task, args, kwargs):
        """The row to insert and the call it stores, checked completely first: bad input raises
        and stores nothing."""
        try:
            call = {"format": FORMAT, "backend": self.alias, "task": task.module_path, "queue": task.queue_name,
                    "args": normalize_json(list(args)), "kwargs": normalize_json(dict(kwargs))}
        except (TypeError, ValueError) as exc:
            raise InvalidTaskArguments(f"the arguments of {task.module_path} are not JSON: {exc}") from None
        if task.run_after is not None:
            call["run_after"] = task.run_after.isoformat()
        try:
            attribute = validation.attribute(call, get_settings().MAX_ATTRIBUTE_BYTES)
        except InvalidAttribute as exc:
            raise InvalidTaskArguments(f"the arguments of {task.module_path}: {exc}") from None
        if task.run_after is None:
            at, delay = None, timedelta(0)  # now, by the database clock
        else:
            at, delay = validation.action_time(at=task.run_after)
        new = NewTask(biz_type=tasks_queues.biz_type_for(self.alias, task.queue_name),
                      biz_id=task.module_path[:MAX_BIZ_ID], at=at, delay=delay, attribute=attribute,
                      max_attempts=self.max_attempts, ttr=self.ttr, on_conflict=None)
        return new, call

    def get_result(self, result_id: str) -> TaskResult:
        key = results.parse_result_id(result_id)
        connection = connections[shards.alias_of_job(key["job_id"])]
        # Else it moved since (an operator requeued it), or went with its partition.
        prefix = tasks_queues.PREFIX  # a row of another kind is no task of ours
        row = (fetch_one("tasks_backend_result", {**key, "prefix": prefix}, using=connection)
               or fetch_one("tasks_backend_result_moved", {"job_id": key["job_id"], "prefix": prefix},
                            using=connection))
        if row is None:
            raise results.missing(result_id, key)
        if results.call_of(row)["backend"] != self.alias:
            raise TaskResultDoesNotExist(f"task result {result_id} is of another backend than {self.alias!r}")
        return results.from_row(self, row)
