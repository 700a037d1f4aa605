"""The worker side of `timeouts.run`: compare-and-set, run the handler, record the outcome."""

import logging
import random
import sys
import time
import traceback
from typing import NamedTuple

from billiard import common as billiard_common
from celery.exceptions import WorkerShutdown, WorkerTerminate
from django.db import InterfaceError, OperationalError, ProgrammingError
from psycopg.errors import UndefinedTable

from timeouts import events
from timeouts.conf import notify_params
from timeouts.models import TimeoutTask
from timeouts.protocol import Fence
from timeouts.registry import get_handler
from timeouts.store import worker_connection
from timeouts.store.queries import fetch_one, is_partition_name
from timeouts.store.serialization import retry_on_conflict
from timeouts.testing import faults
from timeouts.worker import leases

logger = logging.getLogger(__name__)

MAX_BACKOFF = 3600.0  # seconds
MAX_ERROR_LENGTH = 20_000
# A message that arrives this much before its run_at is stale (the task was rescheduled), not early.
MAX_EARLY_WAIT = 5.0
# Seconds between attempts to record a handler's outcome after the connection broke: the handler has
# run, and a task left RUNNING would run again once its lease is out.
OUTCOME_RETRY_DELAYS = (0.2, 1.0, 3.0)


def backoff_seconds(attempt: int) -> float:
    """Exponential with jitter: 1-2 s after the first failure, doubling, capped at an hour."""
    ceiling = min(MAX_BACKOFF, 2.0**attempt)
    return random.uniform(ceiling / 2, ceiling)


def error_text(text: str) -> str:
    """An error as a row stores it (last_error, a result's errors): its last MAX_ERROR_LENGTH
    characters, where a traceback says what failed, and what PostgreSQL's text cannot hold written
    as repr() writes it: NUL as the four characters \\x00, a lone surrogate (undecodable bytes of a
    file name) as \\udc80. An escape rather than U+FFFD still says which character it was, and reads
    as in Python. Refused, the error would take the whole outcome with it: the row would stay
    RUNNING until its lease ran out."""
    storable = text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")
    return storable[-MAX_ERROR_LENGTH:]


# billiard's handler of SIGTERM in a pool process sets a flag, then raises SystemExit wherever the
# process was. Older billiard versions have the flag without the function that reads it.
_terminate_handler_fired = getattr(billiard_common, "terminate_handler_fired",
                                   lambda: billiard_common._should_have_exited[0])


def stops_the_worker(exc: BaseException) -> bool:
    """Whether `exc` is the worker stopping the attempt rather than the attempt failing: Ctrl-C,
    Celery's shutdown (WorkerShutdown, WorkerTerminate), gevent or eventlet killing the greenlet,
    or anything raised once billiard's SIGTERM handler has run in this pool process (its
    SystemExit, or an error of a cleanup it interrupted: billiard reports no result for that job
    either). Such an attempt has not ended: nothing is recorded, and lease recovery moves it on
    once its lease runs out, as when the worker is killed. Anything else, a SystemExit of the code's own (sys.exit(),
    argparse) or an asyncio.CancelledError included, is the attempt's failure, as Django's
    ImmediateBackend records it."""
    greenlet = sys.modules.get("greenlet")
    return (isinstance(exc, (KeyboardInterrupt, WorkerShutdown, WorkerTerminate))
            or (greenlet is not None and isinstance(exc, greenlet.GreenletExit))
            or _terminate_handler_fired())


class Done(NamedTuple):
    """A handler that returned, its DONE not written yet: a batch writes it in one statement with
    its next task's start (finish_then_start_task), or alone with finish()."""

    task: TimeoutTask
    key: dict  # the task's job_id and action_time
    attempt: int
    partition: str | None

    @property
    def params(self) -> dict:
        """finish_task's parameters."""
        return {**self.key, "attempt": self.attempt}


def run(fence: Fence, lease_extra: float = 0.0) -> str:
    """Run the attempt of `fence` if its message still owns it; returns what happened. Its
    partition, where the claim found the row, is where the start and the DONE go straight.
    `lease_extra`: seconds of lease beyond the TTR (a batch's time limit is longer than one TTR)."""
    _, outcome, done = run_leaving_done(fence, lease_extra)
    return outcome if done is None else finish(done)


def run_leaving_done(fence: Fence, lease_extra=0.0, previous: Done | None = None):
    """run(), except that a handler that returns leaves its DONE to the caller, who writes it with
    finish() or passes it on as the next task's `previous`: then one statement writes it and starts
    that task. Returns (previous's outcome, this task's outcome or None, this task's Done or None)."""
    job_id, attempt, key, partition = fence.job_id, fence.attempt, fence.key, fence.partition
    # Inside a host's transaction (an eager task) a missing partition would abort it: no shortcut.
    partition = partition if is_partition_name(partition) and not worker_connection.current().in_atomic_block else None
    if previous is not None and previous.partition == partition:
        task, previous_outcome = _finish_then_start(previous, key, attempt, lease_extra, partition)
    else:
        previous_outcome = None if previous is None else finish(previous)
        task = start(key, attempt, lease_extra, partition)
    if task is None:
        logger.info("timeouts: dropped stale message for job %s attempt %s", job_id, attempt)
        return previous_outcome, "dropped", None
    events.started(task, attempt)
    faults.fault("run.after_start")
    # A pool that cannot stop the handler at its hard time limit (the TTR) keeps its lease instead.
    lease = None if leases.pool_stops_handlers() else leases.heartbeat.add(
        worker_connection.current().alias, key, attempt, task.ttr)
    try:
        get_handler(task.biz_type)(task)
    except BaseException as exc:
        if stops_the_worker(exc):
            raise
        # Any other BaseException is the handler's failure too, retried or DEAD as any; returning
        # its outcome keeps the pool process serving (billiard ends one that a SystemExit leaves).
        error = error_text(traceback.format_exc())
        params = {**key, "attempt": attempt, "error": error, "backoff": backoff_seconds(attempt), **notify_params()}
        row = record_outcome("fail_task", params)
        outcome = "lost" if row is None else ("dead" if row["status"] == TimeoutTask.Status.DEAD else "retry")
        logger.warning("timeouts: %s attempt %s failed (%s)", task, attempt, outcome, exc_info=True)
        return previous_outcome, events.ran(task, outcome), None
    finally:
        leases.heartbeat.remove(lease)
    return previous_outcome, None, Done(task, key, attempt, partition)


def finish(done: Done) -> str:
    """Write a handler's DONE; returns "done", or "lost" if its lease had run out meanwhile."""
    faults.fault("run.before_done")
    row = record_outcome("finish_task", done.params, done.partition)
    faults.fault("run.after_done")
    return _finished(done, row is not None)


def _finished(done: Done, matched: bool) -> str:
    if not matched:
        # The lease ran out and recovery moved the task on: another attempt will run.
        logger.warning("timeouts: %s finished after its lease expired", done.task)
        return "lost"
    return events.ran(done.task, "done")


def _finish_then_start(previous: Done, key: dict, attempt: int, lease_extra: float, partition):
    """previous's DONE and this task's compare-and-set in one statement; returns (the task or None,
    previous's outcome). If the start matched nothing, start() decides as for any message (early,
    stale, or its row moved); if the DONE did (its row moved), it is tried again through the parent.
    If the statement fails, the DONE is written alone before the error goes on (a repeat is safe)."""
    params = {**{f"done_{name}": value for name, value in previous.params.items()},
              **key, "attempt": attempt, "lease_extra": lease_extra}
    try:
        faults.fault("run.before_done")
        row = _on_a_new_connection_if_broken("finish_then_start_task", params, (0.0,), partition)
    except Exception:
        finish(previous)
        raise
    finished = row["finished"] or record_outcome("finish_task", previous.params) is not None
    faults.fault("run.after_done")
    task = TimeoutTask._from_row(row) if row["job_id"] is not None else start(key, attempt, lease_extra, partition)
    return task, _finished(previous, finished)


def record_outcome(query: str, params: dict, partition: str | None = None):
    """finish_task or fail_task, again on a new connection if the connection broke (a killed
    session, a restarted or failed-over server): the handler has run, and a task left RUNNING would
    run again when its lease ran out. Repeating is safe: both match only this attempt's RUNNING row.
    If a COMMIT's answer was lost, the retry matches nothing and the task counts as "lost", which
    is only a label: the outcome is in the database."""
    return _on_a_new_connection_if_broken(query, params, OUTCOME_RETRY_DELAYS, partition)


def _on_a_new_connection_if_broken(query: str, params: dict, delays, partition=None):
    """The query; after a connection error, again on a new connection after each delay in turn (the
    last try's error propagates). Inside the caller's transaction an error always propagates."""
    for delay in delays:
        try:
            return retry_on_conflict(lambda: _where_the_row_is(query, params, partition))
        except (OperationalError, InterfaceError) as exc:
            db = worker_connection.current()
            if db.in_atomic_block:
                raise
            logger.warning("timeouts: %s failed (%s); reconnecting in %.1f s", query, exc, delay)
            db.close()
            time.sleep(delay)
    return retry_on_conflict(lambda: _where_the_row_is(query, params, partition))


def _where_the_row_is(query: str, params: dict, partition: str | None):
    """The query on the task's partition, where PostgreSQL reuses its plan; through the parent
    table if it matched nothing there: the row may have moved since the claim (maintenance moves
    rows out of DEFAULT), or the partition be gone. A stale message pays one statement more."""
    if partition is not None:
        try:
            row = fetch_one(query, params, partition=partition)
        except ProgrammingError as exc:
            if not isinstance(exc.__cause__, UndefinedTable):
                raise
            row = None
        if row is not None:
            return row
    return fetch_one(query, params)


def start(key: dict, attempt: int, lease_extra: float = 0.0, partition: str | None = None, ahead: float = 0.0):
    """The compare-and-set DISPATCHED -> RUNNING for this attempt, or None if the message is stale.

    A message may arrive before run_at (the dispatcher publishes a little early, or clocks differ):
    then wait out the difference by the database clock, and compare-and-set again. With `ahead`
    (seconds), the start may be recorded up to that much before run_at, and this returns at run_at
    by the database clock: its answer came at database_now or later, so after waiting out
    run_at - database_now from then, the database's clock has reached run_at.
    """
    params = {**key, "attempt": attempt, "lease_extra": lease_extra, "ahead": ahead}
    for _ in range(10):
        row = _compare_and_set(params, partition)
        if row is not None:
            early = (row["run_at"] - row["database_now"]).total_seconds()
            if early > 0:
                time.sleep(early)
            return TimeoutTask._from_row(row)
        state = fetch_one("task_state", key)
        if state is None or state["status"] != TimeoutTask.Status.DISPATCHED or state["attempts"] != attempt - 1:
            return None
        wait = (state["run_at"] - state["now"]).total_seconds()
        if wait > MAX_EARLY_WAIT:
            return None
        time.sleep(max(wait - ahead, 0.001))
    return None


def start_ahead(key: dict, attempt: int, partition: str | None, ahead: float):
    """The compare-and-set start of a message received up to `ahead` seconds before run_at, without
    waiting for run_at (call_starts.py): the row with database_now, or None if it is refused (stale,
    cancelled, or due later than that)."""
    return _compare_and_set({**key, "attempt": attempt, "lease_extra": 0.0, "ahead": ahead}, partition)


def confirm_start(key: dict, attempt: int, partition: str | None = None) -> bool:
    """Whether a start recorded earlier (start_ahead) still holds, its lease renewed for a whole TTR:
    the body of a call may run only then."""
    return _on_a_new_connection_if_broken("confirm_start", {**key, "attempt": attempt}, (0.0,), partition) is not None


def _compare_and_set(params, partition=None):
    """start_task, again on a new connection if the connection turns out to be broken: a worker
    checks its connection's health after each message, not before the next (tasks.py), so one that
    died while the worker was idle fails here. Repeating is safe: if the first try committed and
    only its answer was lost, the second matches nothing and the message is dropped as stale; the
    task's lease then runs out and lease recovery moves it on, as for a worker lost mid-start."""
    return _on_a_new_connection_if_broken("start_task", params, (0.0,), partition)
