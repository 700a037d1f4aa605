"""Result ids and the TaskResult of a stored row.

A result id is `<job_id>-<action_time in microseconds since the epoch>`: the row's primary key, so
get_result() reads one row of one partition. Once that partition has been dropped (RETENTION after
its tasks finished), the id still tells when the task was due, and the error says it expired.
"""

import json
from datetime import UTC, datetime, timedelta

from django.utils.module_loading import import_string

from timeouts.backends.compat import TaskError, TaskResult, TaskResultDoesNotExist, TaskResultStatus
from timeouts.backends.errors import Cancelled, LeaseExpired, StartedLate
from timeouts.conf import get_settings
from timeouts.limiting import lateness
from timeouts.states import Status

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

STATUSES = {
    Status.PENDING: TaskResultStatus.READY,
    Status.DISPATCHED: TaskResultStatus.READY,  # claimed, on its way to a worker
    Status.RUNNING: TaskResultStatus.RUNNING,
    Status.DONE: TaskResultStatus.SUCCESSFUL,
    Status.DEAD: TaskResultStatus.FAILED,  # every attempt failed
    Status.CANCELLED: TaskResultStatus.FAILED,  # never started: Django has no status of its own for it
}


def result_id(job_id: int, action_time: datetime) -> str:
    return f"{job_id}-{(action_time - EPOCH) // timedelta(microseconds=1)}"


def parse_result_id(value) -> dict:
    """The row's key, {"job_id", "action_time"}; TaskResultDoesNotExist for what is no id of ours."""
    try:
        job_id, micros = (int(part) for part in str(value).split("-", 1))  # a time before 1970 is negative
        if not 0 < job_id < 2**63:  # a bigint
            raise ValueError(job_id)
        return {"job_id": job_id, "action_time": EPOCH + timedelta(microseconds=micros)}
    except (ValueError, OverflowError):
        raise TaskResultDoesNotExist(
            f"{value!r} is not a result id of timeouts.backends.TimeoutsBackend "
            "(<job_id>-<due time in microseconds>)") from None


def missing(value, key) -> TaskResultDoesNotExist:
    """No row for this id: expired (its partition dropped) if it was due before RETENTION, else unknown."""
    retention = get_settings().RETENTION
    if key["action_time"] < datetime.now(UTC) - retention:
        return TaskResultDoesNotExist(
            f"task result {value} has expired: the task was due {key['action_time'].isoformat()}, and results "
            f"are kept for TIMEOUTS['RETENTION'] ({retention}) after their day's tasks finished, then dropped "
            "with their partition")
    return TaskResultDoesNotExist(f"task result {value} does not exist")


def from_row(backend, row, *, errors=None, worker_ids=None):
    """The TaskResult of a row of tasks_backend_result (or of a started task). `errors` and
    `worker_ids` replace the row's columns when given (the worker has fresher ones)."""
    call = call_of(row)
    status = Status(row["status"])
    task = import_string(call["task"])
    changes = {"backend": backend.alias, "queue_name": call["queue"]}
    if call.get("run_after"):
        changes["run_after"] = datetime.fromisoformat(call["run_after"])
    task = task.using(**changes)
    result = TaskResult(
        task=task,
        id=result_id(row["job_id"], row["action_time"]),
        status=STATUSES[status],
        enqueued_at=row["created_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"] if status in (Status.DONE, Status.DEAD, Status.CANCELLED) else None,
        last_attempted_at=row["started_at"],
        args=call["args"],
        kwargs=call["kwargs"],
        backend=backend.alias,
        errors=task_errors(row, errors),
        worker_ids=_worker_ids(worker_ids if worker_ids is not None else row.get("worker_ids"), row["attempts"]),
    )
    if status == Status.DONE:
        object.__setattr__(result, "_return_value", _json(row.get("return_value")))
    return result


def call_of(row) -> dict:
    """The call a row stores: the task's path, queue, arguments and the backend's alias."""
    return _json(row["attribute"])


def task_errors(row, stored=None) -> list:
    """The stored error of each failed attempt; an attempt that ended without one (its lease ran
    out) shows as LeaseExpired, a cancelled task ends with Cancelled, and one that its lateness
    policy ended with StartedLate."""
    stored = _json(stored if stored is not None else row.get("errors")) or []
    errors = [TaskError(exception_class_path=e["exception_class_path"], traceback=e["traceback"]) for e in stored]
    status = Status(row["status"])
    failed_attempts = row["attempts"] - (1 if status in (Status.RUNNING, Status.DONE) else 0)
    while len(errors) < failed_attempts:
        errors.append(TaskError(exception_class_path=_path(LeaseExpired), traceback=row["last_error"] or ""))
    if lateness.ended_late(status, row["last_error"]):
        errors.append(TaskError(exception_class_path=_path(StartedLate), traceback=row["last_error"]))
    elif status == Status.CANCELLED:
        why = "cancelled before it started" if not row["attempts"] else "discarded after its last attempt failed"
        errors.append(TaskError(exception_class_path=_path(Cancelled), traceback=why))
    return errors


def _worker_ids(stored, attempts) -> list:
    """One per attempt. An attempt lost between its start and the statement that records its worker
    has none: shown as ""."""
    ids = list(stored or [])
    return ids + [""] * (attempts - len(ids))


def _path(cls) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _json(value):
    """A jsonb column, which the queries return as text (None for NULL); or the attribute of a
    TimeoutTask, which its JSONField has parsed already."""
    return json.loads(value) if isinstance(value, (str, bytes)) else value
