"""The statements that move an attempt along: its compare-and-set start, its lease, its outcome.

Each is a named query (sql/queries.sql, sql/tasks_backend.sql) fenced by the attempt: it matches
only the row whose current attempt it is, in the state it expects, so a stale message, a cancel
that won, or an attempt whose lease ran out changes nothing. `key` is the row's
{job_id, action_time}; `partition` (a name checked by queries.is_partition_name, or None) is where
the claim found the row: a statement goes straight there, where PostgreSQL reuses its prepared
plan, and through the parent table if it matched nothing there (the row moved since).

A statement that finds the worker's connection broken runs again on a new one (`_again_if_broken`):
after the handler has run, a task left RUNNING would run again once its lease is out. Repeating
is safe, since the fence matches only once: a COMMIT whose answer was lost makes the repeat match
nothing, which is reported as if the lease had run out (the outcome is in the database).
"""

import logging
import time

from django.db import InterfaceError, OperationalError, ProgrammingError
from psycopg.errors import UndefinedTable

from timeouts.conf import notify_params
from timeouts.store import worker_connection
from timeouts.store.queries import fetch_dicts, fetch_one
from timeouts.store.serialization import retry_on_conflict

logger = logging.getLogger(__name__)

# Seconds between tries to record an outcome after the connection broke: the work has run.
OUTCOME_RETRY_DELAYS = (0.2, 1.0, 3.0)
# A start once more at once: a worker checks its connection's health after each message, not
# before the next (tasks.py), so one that died while the worker was idle fails here.
ONCE_MORE = (0.0,)


# --- Starting ---------------------------------------------------------------------------------------

def start(key: dict, attempt: int, partition=None, lease_extra: float = 0.0, ahead: float = 0.0) -> dict | None:
    """The compare-and-set DISPATCHED -> RUNNING of this attempt (start_task): the row, with
    database_now, or None. `ahead`: seconds before run_at it may be recorded; `lease_extra`: seconds
    of lease beyond the TTR. If the first try committed and only its answer was lost, the second
    matches nothing and the message is dropped as stale; the task's lease then runs out and lease
    recovery moves it on, as for a worker lost mid-start."""
    params = {**key, "attempt": attempt, "lease_extra": lease_extra, "ahead": ahead}
    return _again_if_broken("start_task", params, ONCE_MORE, partition)


def start_calls_ahead(starts: list[tuple[dict, int]], partition: str, ahead: float) -> list[dict]:
    """The compare-and-set starts of several stored Celery calls, (key, attempt) each, on `partition`
    in one statement (start_calls_ahead): the rows it started, with database_now. A call it did not
    find there is left to start() through the parent."""
    params = {"job_ids": [key["job_id"] for key, _ in starts],
              "action_times": [key["action_time"] for key, _ in starts],
              "attempts": [attempt for _, attempt in starts], "lease_extra": 0.0, "ahead": ahead}
    return _retried("start_calls_ahead", ONCE_MORE, lambda: _on_partition("start_calls_ahead", params, partition))


def _on_partition(query: str, params: dict, partition: str) -> list[dict]:
    """The query's rows on `partition`; none if that partition is gone."""
    try:
        return fetch_dicts(query, params, partition=partition)
    except ProgrammingError as exc:
        if not isinstance(exc.__cause__, UndefinedTable):
            raise
        return []


def state(key: dict) -> dict | None:
    """The row's status, attempts and run_at, and the database clock (task_state): why a start
    matched nothing."""
    return fetch_one("task_state", key)


def confirm_start(key: dict, attempt: int, partition=None) -> bool:
    """Whether a start recorded earlier still holds (RUNNING for this attempt), its lease renewed
    for a whole TTR (confirm_start)."""
    return _again_if_broken("confirm_start", {**key, "attempt": attempt}, ONCE_MORE, partition) is not None


def finish_then_start(done_key: dict, done_attempt: int, key: dict, attempt: int, lease_extra: float,
                      partition=None) -> tuple[dict | None, bool]:
    """A DONE and the next task's start in one statement (finish_then_start_task), both on
    `partition`: (the started row, or None if the start matched nothing; whether the DONE matched).
    A DONE that matched nothing there is tried again through the parent."""
    params = {"done_job_id": done_key["job_id"], "done_action_time": done_key["action_time"],
              "done_attempt": done_attempt, **key, "attempt": attempt, "lease_extra": lease_extra}
    row = _again_if_broken("finish_then_start_task", params, ONCE_MORE, partition)
    finished = row["finished"] or finish(done_key, done_attempt) is not None
    return (row if row["job_id"] is not None else None), finished


# --- Ending -----------------------------------------------------------------------------------------

def finish(key: dict, attempt: int, partition=None) -> dict | None:
    """RUNNING -> DONE (finish_task); None if the attempt's lease had run out."""
    return _again_if_broken("finish_task", {**key, "attempt": attempt}, OUTCOME_RETRY_DELAYS, partition)


def fail(key: dict, attempt: int, error: str, backoff: float) -> dict | None:
    """RUNNING -> PENDING after `backoff` seconds, or DEAD once attempts are used up (fail_task);
    the row's new status, or None if the attempt's lease had run out."""
    params = {**key, "attempt": attempt, "error": error, "backoff": backoff, **notify_params()}
    return _again_if_broken("fail_task", params, OUTCOME_RETRY_DELAYS)


def end_call(key: dict, attempt: int, status: int, error: str, started_at, partition=None) -> dict | None:
    """A stored Celery call's outcome, DONE or DEAD (end_call); None if its lease had run out."""
    params = {**key, "attempt": attempt, "status": int(status), "error": error, "started_at": started_at}
    return _again_if_broken("end_call", params, OUTCOME_RETRY_DELAYS, partition)


def end_timed_out_call(task_id: str, prefix: str, error: str) -> list[dict]:
    """DEAD for the running calls of `task_id` (biz_types starting with `prefix`, their kind's) that
    Celery killed at their hard time limit."""
    return fetch_dicts("end_timed_out_call", {"task_id": task_id, "prefix": prefix, "error": error})


# --- Leases -----------------------------------------------------------------------------------------

def params_by_shard(attempts) -> dict:
    """The array parameters of a statement on many started attempts at once (their job_ids,
    action_times and attempts), per shard, from (shard, job_id, action_time, attempt) tuples."""
    by_shard = {}
    for shard, job_id, action_time, attempt in attempts:
        params = by_shard.setdefault(shard, {"job_ids": [], "action_times": [], "attempts": []})
        params["job_ids"].append(job_id)
        params["action_times"].append(action_time)
        params["attempts"].append(attempt)
    return by_shard


def extend_leases(params: dict):
    """Extend the leases of started attempts still RUNNING (params_by_shard's arrays)."""
    fetch_dicts("extend_leases", params)


def give_back_call_starts(params: dict):
    """Calls started ahead whose messages the worker dropped: PENDING again, with a NOTIFY."""
    fetch_dicts("give_back_call_starts", {**params, **notify_params()})


# --- What a task of Django's tasks framework keeps for its result -----------------------------------

def note_worker(key: dict, attempt: int, worker_id: str, partition=None) -> dict | None:
    """Which worker runs the attempt; the row's errors and worker_ids, or None if it is not RUNNING."""
    return _again_if_broken("tasks_backend_started", {**key, "attempt": attempt, "worker_id": worker_id},
                            OUTCOME_RETRY_DELAYS, partition)


def keep_return_value(key: dict, attempt: int, return_value: str, partition=None):
    _again_if_broken("tasks_backend_returned", {**key, "attempt": attempt, "return_value": return_value},
                     OUTCOME_RETRY_DELAYS, partition)


def keep_error(key: dict, attempt: int, exception_class_path: str, traceback: str, partition=None):
    _again_if_broken("tasks_backend_failed", {**key, "attempt": attempt, "exception_class_path": exception_class_path,
                                              "traceback": traceback}, OUTCOME_RETRY_DELAYS, partition)


# --- Where and how -----------------------------------------------------------------------------------

def _again_if_broken(query: str, params: dict, delays, partition=None):
    """The query, on the row's partition if known (_where_the_row_is), _retried."""
    return _retried(query, delays, lambda: _where_the_row_is(query, params, partition))


def _retried(query: str, delays, statement):
    """statement(); after a connection error, again on a new connection after each delay in turn
    (the last try's error propagates). Inside the caller's transaction an error always propagates."""
    db = worker_connection.current()  # a retry in the caller's transaction takes its savepoint on this shard
    for delay in delays:
        try:
            return retry_on_conflict(statement, using=db.alias)
        except (OperationalError, InterfaceError) as exc:
            if db.in_atomic_block:
                raise
            logger.warning("timeouts: %s failed (%s); reconnecting in %.1f s", query, exc, delay)
            db.close()
            time.sleep(delay)
    return retry_on_conflict(statement, using=db.alias)


def _where_the_row_is(query: str, params: dict, partition):
    """The query on the task's partition, where PostgreSQL reuses its plan; through the parent
    table if it matched nothing there: the row may have moved since the claim (maintenance moves
    rows out of DEFAULT), or the partition be gone. A stale message pays one statement more."""
    if partition is not None:
        rows = _on_partition(query, params, partition)
        if rows:
            return rows[0]
    return fetch_one(query, params)
