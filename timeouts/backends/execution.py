"""The worker's side: run one attempt of a task of Django's tasks framework.

`timeouts.run` has started the attempt with its compare-and-set (worker/attempt.py), and calls
`run()` as the handler of the task's queue (queues.py); what `run()` returns or raises is recorded
as for any handler: DONE, or a retry with backoff, or DEAD once MAX_ATTEMPTS attempts failed.
Before that, `run()` keeps what Django's result needs in the row, each statement fenced by this
attempt (store/attempts.py: status RUNNING, attempts = this attempt): which worker runs it, then
the return value or the error. Django's signals go out from here: task_started once the attempt
is noted, task_finished once its outcome is final (a success, or the last attempt's failure), just
before the attempt's outcome is committed.
"""

import json
import logging
import os
import socket
import traceback

from celery import current_task

from timeouts.backends import results
from timeouts.backends.compat import (
    TaskContext,
    TaskError,
    TaskResultStatus,
    normalize_json,
    task_backends,
    task_finished,
    task_started,
)
from timeouts.conf import get_settings
from timeouts.states import Status
from timeouts.storage.partitions import bucket_start, partition_name
from timeouts.store import attempts, worker_connection
from timeouts.worker.attempt import error_text, stops_the_worker

logger = logging.getLogger(__name__)


def run(alias, task):
    """Run the attempt `task.attempts` of `task` (a TimeoutTask, RUNNING) on backend `alias`."""
    key, attempt = {"job_id": task.job_id, "action_time": task.action_time}, task.attempts
    # Inside a host's transaction (an eager task) a missing partition would abort it: no shortcut.
    partition = None if worker_connection.current().in_atomic_block else partition_of(task.action_time)
    started = attempts.note_worker(key, attempt, worker_id(), partition)
    if started is None:  # the lease ran out already: another attempt owns the row
        logger.warning("timeouts: %s lost its lease before it started", task)
        return
    try:  # a task whose module or backend this worker cannot load fails as if it had raised
        backend = task_backends[alias]
        result = results.from_row(backend, _row(task), errors=started["errors"], worker_ids=started["worker_ids"])
    except BaseException as exc:
        if not stops_the_worker(exc):
            _record_error(key, attempt, exc, partition)
        raise
    task_started.send(type(backend), task_result=result)
    try:
        func_args = [TaskContext(task_result=result), *result.args] if result.task.takes_context else result.args
        return_value = json.dumps(normalize_json(result.task.call(*func_args, **result.kwargs)), allow_nan=False)
        if "\\u0000" in return_value:
            raise ValueError("the return value holds NUL (\\u0000), which PostgreSQL cannot store")
    except BaseException as exc:
        # As Django's ImmediateBackend, a SystemExit or CancelledError of the task's own is its
        # error; what stops the worker leaves the attempt to its lease (attempt.stops_the_worker).
        if stops_the_worker(exc):
            raise
        error = _record_error(key, attempt, exc, partition)
        if task.attempts >= task.max_attempts:  # fail_task makes it DEAD: the result is final
            _set(result, status=TaskResultStatus.FAILED, errors=[*result.errors, error])
            task_finished.send(type(backend), task_result=result)  # inside except: exc_info for its log
        raise
    # Like the attempt's outcome, again on a new connection if this one broke: the task has run.
    attempts.keep_return_value(key, attempt, return_value, partition)
    _set(result, status=TaskResultStatus.SUCCESSFUL, _return_value=json.loads(return_value))
    task_finished.send(type(backend), task_result=result)


def _record_error(key, attempt, exc, partition) -> TaskError:
    """Append the attempt's error to the row. A failure to do so is logged: the task's own
    exception goes on to the attempt, which records the retry or DEAD (and the error as last_error)."""
    error = TaskError(exception_class_path=f"{type(exc).__module__}.{type(exc).__qualname__}",
                      traceback=error_text("".join(traceback.format_exception(exc))))
    try:
        attempts.keep_error(key, attempt, error.exception_class_path, error.traceback, partition)
    except Exception:
        logger.exception("timeouts: could not record the error of job %s attempt %s", key["job_id"], attempt)
    return error


def partition_of(action_time) -> str:
    """The partition that holds a task due at `action_time` once maintenance has created it: the
    worker's statements go straight there, where PostgreSQL reuses their prepared plans (through
    the partitioned parent it plans them anew each time). A row still in DEFAULT, or a partition
    named for another PARTITION_INTERVAL, is found through the parent (store/attempts.py)."""
    interval = get_settings().PARTITION_INTERVAL
    return partition_name(bucket_start(action_time, interval), interval)


def worker_id() -> str:
    """The Celery worker's node name and the pool process: `celery@host:1234`."""
    request = getattr(current_task, "request", None)
    node = getattr(request, "hostname", None) or socket.gethostname()
    return f"{node}:{os.getpid()}"


def _row(task) -> dict:
    return {"job_id": task.job_id, "action_time": task.action_time, "status": Status.RUNNING,
            "attribute": task.attribute, "attempts": task.attempts, "last_error": task.last_error,
            "created_at": task.created_at, "started_at": task.started_at, "finished_at": None}


def _set(result, **fields):
    """TaskResult is frozen: Django's own backends change it so as a task runs."""
    for name, value in fields.items():
        object.__setattr__(result, name, value)
