"""Tasks in a given state, for tests that start from one.

`make_task(status, ...)` schedules a task with the public API, then moves it to `status` the way the
product does wherever a public or worker-side step exists:

- PENDING: schedule() alone (with on_conflict=None: a key may have several tasks).
- CANCELLED: task.cancel().
- DISPATCHED, RUNNING: one explicit UPDATE (no public call claims one chosen task: a claim takes
  whatever is due), with a lease; RUNNING has used an attempt and has a started_at.
- DONE: RUNNING, then the worker's own finish_task statement.
- DEAD: RUNNING on its last attempt, then the worker's own fail_task statement (a failed last
  attempt), which records `last_error`.

`move_to(task, status, ...)` does the same to a task that is PENDING already (scheduled at a chosen
time, say), and `cancel_all()` cancels every PENDING task at once, for tests with thousands.
Statuses are always TimeoutTask.Status members, passed as query parameters.
"""

from datetime import UTC, datetime, timedelta

from django.db import connection

from timeouts.conf import notify_params
from timeouts.models import TimeoutTask
from timeouts.store.queries import fetch_one

Status = TimeoutTask.Status
STARTED = (Status.RUNNING, Status.DONE, Status.DEAD)
DEFAULT_ERROR = "Traceback (most recent call last):\nRuntimeError: failed in a test"


def make_task(status=Status.PENDING, *, biz_type="test.record", biz_id="1", at=None, delay=None, attribute=None,
              **state) -> TimeoutTask:
    """A task of `biz_type` in `status`, read back from the database.

    When: `at` or `delay` as for schedule(); by default a task that has started (RUNNING, DONE, DEAD)
    was due 5 minutes ago and any other is due in 2 hours. `state`: see move_to()."""
    if at is None and delay is None:
        at = datetime.now(UTC) + (-timedelta(minutes=5) if status in STARTED else timedelta(hours=2))
    # on_conflict=None: a test may want several tasks of one key, each in a state of its own.
    task = TimeoutTask.objects.schedule(biz_type, biz_id, at=at, delay=delay, attribute=attribute, on_conflict=None)
    return move_to(task, status, **state)


def move_to(task, status, *, attempts=None, started_after=None, last_error=None, lease=timedelta(hours=1)):
    """Move a PENDING `task` to `status`; returns it read back from the database.

    attempts: the attempts used (DISPATCHED: before this dispatch, default as scheduled; RUNNING and
      DONE: including this one, default 1; DEAD: its last, so max_attempts, the only value allowed).
    started_after: a timedelta or seconds; started_at is action_time plus this (default: now).
    last_error: what the failed last attempt of a DEAD task left (default DEFAULT_ERROR).
    lease: how long a DISPATCHED or RUNNING task keeps its lease from now (negative: expired).
    """
    status = Status(status)
    if status == Status.PENDING:
        return _reload(task)
    if status == Status.CANCELLED:
        assert task.cancel() is True, f"{task} could not be cancelled"
        return _reload(task)
    if status == Status.DISPATCHED:
        _update(task, "status = %(status)s, attempts = coalesce(%(attempts)s, attempts), dispatched_at = now(), "
                      "lease_until = now() + %(lease)s",
                status=Status.DISPATCHED, attempts=attempts, lease=lease)
        return _reload(task)
    if status == Status.DEAD:
        if attempts not in (None, task.max_attempts):
            raise ValueError(f"a DEAD task has used its max_attempts ({task.max_attempts}), not {attempts}")
        attempts = task.max_attempts
    running = _start(task, attempts or 1, started_after, lease)
    key = {"job_id": task.job_id, "action_time": task.action_time, "attempt": running.attempts}
    if status == Status.DONE:
        assert fetch_one("finish_task", key, using=connection) is not None
    elif status == Status.DEAD:
        row = fetch_one("fail_task", {**key, "error": DEFAULT_ERROR if last_error is None else last_error,
                                      "backoff": 0, **notify_params()}, using=connection)
        assert row is not None and row["status"] == Status.DEAD, row
    return _reload(task)


def cancel_all():
    """Every task CANCELLED in one statement, for data sets too large to cancel one by one; returns
    how many."""
    with connection.cursor() as cursor:
        cursor.execute("UPDATE timeouts_task SET status = %s, finished_at = clock_timestamp(), "
                       "modified_at = clock_timestamp() WHERE status = %s", [Status.CANCELLED, Status.PENDING])
        return cursor.rowcount


def _start(task, attempts, started_after, lease):
    """The task RUNNING, as a worker's start leaves it: an attempt used, started_at, a lease."""
    if started_after is not None and not isinstance(started_after, timedelta):
        started_after = timedelta(seconds=started_after)
    _update(task, "status = %(status)s, attempts = %(attempts)s, dispatched_at = now(), "
                  "started_at = coalesce(action_time + %(started_after)s, now()), lease_until = now() + %(lease)s",
            status=Status.RUNNING, attempts=attempts, started_after=started_after, lease=lease)
    return _reload(task)


def _update(task, assignments, **params):
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE timeouts_task SET {assignments}, modified_at = clock_timestamp() "
                       "WHERE job_id = %(job_id)s AND action_time = %(action_time)s",
                       {**params, "job_id": task.job_id, "action_time": task.action_time})
        assert cursor.rowcount == 1, f"{task} is not in timeouts_task"


def _reload(task):
    return TimeoutTask.objects.get(job_id=task.job_id)
