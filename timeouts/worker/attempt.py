"""One attempt of a claimed task, whatever kind of work it is: the one fenced path.

    start (the compare-and-set; or the confirmation of a start recorded ahead)
      -> keep the lease (leases.py) -> run the body -> record how it ended

A message starts its task only if it still owns the row's current attempt (protocol.Fence): a
stale message, a repeat, or one that lost to a cancel is dropped before anything runs. A start
later than its biz_type's lateness policy allows (timeouts.limiting.lateness) ends the task
instead, in the same statement: nothing runs. While the body runs, the heartbeat keeps the lease,
unless the kind leaves it to the pool's hard time limit.
How the attempt ended is written on the row by a statement fenced by the same attempt (store/
attempts.py): DONE; again after a backoff, or DEAD once its attempts are used up; or DEAD at once.
The worker stopping (stops_the_worker) records nothing: the attempt's lease runs out, and lease
recovery moves the task on, as when the worker is killed.

What differs between kinds of work (a handler, a stored Celery call) is a `Kind`: how the body is
called, which statement records its ending, and what counts as an error.

In the caller's process (an eager task, timeouts.testing.run_due) the attempt's statements go to
Django's connection, maybe inside the caller's transaction: no heartbeat then, and the body runs in
a savepoint of that transaction, so that a database error of its own leaves the ending writable.
"""

import logging
import random
import sys
import time
import traceback
from contextlib import contextmanager, nullcontext
from typing import NamedTuple

from celery.exceptions import WorkerShutdown, WorkerTerminate
from django.db import DEFAULT_DB_ALIAS, transaction
from psycopg.pq import TransactionStatus

from timeouts import events, tracing
from timeouts.models import TimeoutTask
from timeouts.protocol import Fence
from timeouts.store import attempts, worker_connection
from timeouts.store.queries import is_partition_name
from timeouts.testing import faults
from timeouts.worker import leases
from timeouts.worker.celery_internals import terminate_handler_fired

logger = logging.getLogger(__name__)

MAX_BACKOFF = 3600.0  # seconds
MAX_ERROR_LENGTH = 20_000
# A message that arrives this much before its run_at is stale (the task was rescheduled), not early.
MAX_EARLY_WAIT = 5.0


class Ending(NamedTuple):
    """How an attempt ended: "done", "retry" (again after a backoff, or DEAD once its attempts are
    used up: fail_task decides) or "dead"; and the error to keep."""

    outcome: str
    error: str = ""


DONE = Ending("done")
# What Kind.record() returns when it could not record and has said so: the body's own outcome
# stands, and the attempt's lease runs out (it runs again: at least once).
NOT_RECORDED = object()


class Kind:
    """What differs between kinds of work. run() is the same for every kind."""

    #: Seconds before run_at that a start may be recorded; run() still returns at run_at by the
    #: database clock.
    ahead = 0.0
    #: Re-raise the body's error once its ending is recorded (a Celery task's own error handling
    #: then takes it); else it is logged, and run() returns the outcome.
    reraises = False
    #: Its DONE is finish_task's, which a batch may write in one statement with the next start.
    joins_next_start = False

    def keeps_lease(self) -> bool:
        """Whether the heartbeat keeps the attempt's lease while the body runs."""
        return True

    def database(self, fence: Fence):
        """Where the attempt's statements go while run() makes them: the current connection."""
        return nullcontext()

    def dropped(self, fence: Fence) -> str:
        """A message that owns no attempt (stale, a repeat, or cancelled): nothing ran."""
        logger.info("timeouts: dropped stale message for job %s attempt %s", fence.job_id, fence.attempt)
        return "dropped"

    def ended_late(self, task, fence: Fence) -> str:
        """A start later than the lateness policy allows ended the task (CANCELLED: "skipped late",
        or DEAD: "dead late"; its last_error says how late): nothing ran."""
        return "skipped late" if task.status == TimeoutTask.Status.CANCELLED else "dead late"

    def ready(self, task, fence: Fence):
        """Just before the body, the attempt started and leased."""

    def call(self, task, fence: Fence):
        """The body."""
        raise NotImplementedError

    def ending(self, task, exc: BaseException) -> Ending:
        """How the body's error (not the worker stopping) ends the attempt: again after a backoff."""
        return Ending("retry", error_text(traceback.format_exc()))

    def record(self, done: "Done"):
        """Write the ending on the row: the row, None if the attempt's lease had run out, or NOT_RECORDED."""
        raise NotImplementedError

    def outcome(self, done: "Done", row: dict) -> str:
        """The outcome that `row`, as record() left it, stands for."""
        return done.ending.outcome


class Done(NamedTuple):
    """A body that has ended, its ending not written yet: finish() writes it, or a batch passes it
    on to run() with the next task (finish_then_start_task)."""

    kind: Kind
    task: TimeoutTask
    fence: Fence
    partition: str | None  # where the row's statements go
    ending: Ending = DONE


def run(kind: Kind, fence: Fence, lease_extra: float = 0.0, previous: Done | None = None):
    """Run the attempt `fence` owns, as `kind` says. A body that returns leaves its DONE to the
    caller (finish(), or `previous` of the next run()). `lease_extra`: seconds of lease beyond the
    TTR (a batch's time limit is longer than one TTR). Returns (previous's outcome, this attempt's
    outcome or None, its Done or None)."""
    with kind.database(fence):
        db = worker_connection.current()
        in_callers_process, in_transaction = not worker_connection.is_own(db), db.in_atomic_block
        # Inside a host's transaction (an eager task) a missing partition would abort it: no shortcut.
        partition = fence.partition if is_partition_name(fence.partition) and not in_transaction else None
        shard = db.alias
        previous_outcome = None
        if fence.started is not None:
            task = _confirmed(fence, partition, shard)
        elif previous is not None and previous.partition == partition and previous.kind.joins_next_start:
            task, previous_outcome = _finish_then_start(previous, fence, lease_extra, partition, kind.ahead)
        else:
            previous_outcome = None if previous is None else finish(previous)
            task = _start(fence.key, fence.attempt, lease_extra, partition, kind.ahead)
    if task is None:
        return previous_outcome, kind.dropped(fence), None
    if task.status != TimeoutTask.Status.RUNNING:
        return previous_outcome, kind.ended_late(task, fence), None
    faults.fault("run.after_start")
    # In the caller's process the body ends before the caller goes on, and the heartbeat's own
    # connection could not see a row of the caller's transaction (or would wait for it).
    keeps_lease = kind.keeps_lease() and not in_callers_process
    lease = leases.heartbeat.add(shard, fence.key, fence.attempt, task.ttr) if keeps_lease else None
    span = tracing.run_started(task, fence, task._trace_context)  # None unless tracing is on
    try:
        with tracing.active(span):
            kind.ready(task, fence)
            events.started(task, fence.attempt)
            with _apart(db) if in_transaction else nullcontext():
                kind.call(task, fence)
    except BaseException as exc:
        if stops_the_worker(exc):
            tracing.run_ended(span, "stopped")
            raise
        leases.heartbeat.remove(lease)
        ending = kind.ending(task, exc)
        if ending.outcome != "done":  # a stored call's Celery Retry or Ignore is no failure
            tracing.run_failed(span, exc)
        outcome = None
        try:
            outcome = _record(Done(kind, task, fence, partition, ending))
        finally:
            tracing.run_ended(span, outcome)
        if kind.reraises:
            raise
        # Any BaseException is the body's failure too; returning its outcome keeps the pool process
        # serving (billiard ends one that a SystemExit leaves).
        logger.warning("timeouts: %s attempt %s failed (%s)", task, fence.attempt, outcome, exc_info=True)
        return previous_outcome, outcome, None
    finally:  # also when the worker is stopping: the lease then runs out
        leases.heartbeat.remove(lease)
    tracing.run_ended(span, "done")
    return previous_outcome, None, Done(kind, task, fence, partition)


@contextmanager
def _apart(db):
    """The body inside the caller's transaction (an eager task, timeouts.testing.run_due), in a
    savepoint: a database error of its own rolls back to there, and the caller's transaction, in
    which the attempt's ending is then written, goes on. Any other error keeps what the body wrote,
    as it would outside a transaction."""
    failure = None
    with transaction.atomic(using=db.alias):
        try:
            yield
        except BaseException as exc:
            if db.needs_rollback or _aborted(db):
                raise
            failure = exc
    if failure is not None:
        raise failure


def _aborted(db) -> bool:
    """Whether a statement failed in `db`'s transaction, which then refuses any other."""
    connection = db.connection
    return connection is not None and connection.info.transaction_status == TransactionStatus.INERROR


def finish(done: Done) -> str:
    """Write a body's DONE; returns "done", or "lost" if its lease had run out meanwhile."""
    faults.fault("run.before_done")
    outcome = _record(done)
    faults.fault("run.after_done")
    return outcome


def _record(done: Done) -> str:
    with done.kind.database(done.fence):
        row = done.kind.record(done)
    if row is NOT_RECORDED:
        return "unrecorded"
    return _recorded(done, row)


def _recorded(done: Done, row) -> str:
    if row is None:
        # The lease ran out and recovery moved the task on: another attempt will run.
        logger.warning("timeouts: %s finished after its lease expired", done.task)
        return "lost"
    return events.ran(done.task, done.kind.outcome(done, row))


def _finish_then_start(previous: Done, fence: Fence, lease_extra: float, partition, ahead: float):
    """previous's DONE and this attempt's compare-and-set in one statement; returns (the task or
    None, previous's outcome). If the start matched nothing, start() decides as for any message
    (early, stale, or its row moved). If the statement fails, the DONE is written alone before the
    error goes on (a repeat is safe)."""
    try:
        faults.fault("run.before_done")
        row, finished = attempts.finish_then_start(previous.fence.key, previous.fence.attempt, fence.key,
                                                   fence.attempt, lease_extra, partition)
    except Exception:
        finish(previous)
        raise
    faults.fault("run.after_done")
    task = _started(_noted(row)) if row is not None else _start(fence.key, fence.attempt, lease_extra, partition, ahead)
    return task, _recorded(previous, {} if finished else None)  # a DONE's outcome reads nothing of its row


def start(key: dict, attempt: int, lease_extra: float = 0.0, partition: str | None = None, ahead: float = 0.0):
    """The compare-and-set DISPATCHED -> RUNNING for this attempt: the RUNNING task, or None if the
    message is stale, or if its start came too late and ended the task (its lateness policy).

    A message may arrive before run_at (the dispatcher publishes a little early, or clocks differ):
    then wait out the difference by the database clock, and compare-and-set again. With `ahead`
    (seconds), the start may be recorded up to that much before run_at, and this returns at run_at
    by the database clock: its answer came at database_now or later, so after waiting out
    run_at - database_now from then, the database's clock has reached run_at.
    """
    task = _start(key, attempt, lease_extra, partition, ahead)
    return task if task is not None and task.status == TimeoutTask.Status.RUNNING else None


def _start(key: dict, attempt: int, lease_extra: float, partition: str | None, ahead: float):
    """start(), except that a task its late start ended is returned too, CANCELLED or DEAD."""
    for _ in range(10):
        row = attempts.start(key, attempt, partition, lease_extra, ahead)
        if row is not None:
            if _noted(row)["status"] != TimeoutTask.Status.RUNNING:
                return _started(row)
            early = (row["run_at"] - row["database_now"]).total_seconds()
            if early > 0:
                time.sleep(early)
            return _started(row)
        state = attempts.state(key)
        if state is None or state["status"] != TimeoutTask.Status.DISPATCHED or state["attempts"] != attempt - 1:
            return None
        wait = (state["run_at"] - state["now"]).total_seconds()
        if wait > MAX_EARLY_WAIT:
            return None
        time.sleep(max(wait - ahead, 0.001))
    return None


def start_ahead(key: dict, attempt: int, partition: str | None, ahead: float):
    """The compare-and-set start of a message received up to `ahead` seconds before run_at, without
    waiting for run_at (durable/starts.py): the row with database_now, or None if it is refused
    (stale, cancelled, or due later than that), or ended by its lateness policy."""
    row = attempts.start(key, attempt, partition, 0.0, ahead)
    if row is None or _noted(row)["status"] != TimeoutTask.Status.RUNNING:
        return None
    return row


def start_calls_ahead(fences: list[Fence], ahead: float) -> dict[int, dict]:
    """start_ahead() of several messages of one shard received ahead: the rows started, by job_id (a
    call refused, stale, or ended by its lateness policy has none). The calls of one partition start
    in one statement, and any it did not find there alone, through the parent."""
    by_partition: dict[str | None, list[Fence]] = {}
    for fence in fences:
        by_partition.setdefault(fence.partition if is_partition_name(fence.partition) else None, []).append(fence)
    rows = {}
    for partition, group in by_partition.items():
        alone, through = group, partition
        if partition is not None and len(group) > 1:
            together = attempts.start_calls_ahead([(fence.key, fence.attempt) for fence in group], partition, ahead)
            rows.update((row["job_id"], row) for row in together)
            alone, through = [fence for fence in group if fence.job_id not in rows], None
        for fence in alone:
            row = attempts.start(fence.key, fence.attempt, through, 0.0, ahead)
            if row is not None:
                rows[fence.job_id] = row
    return {job_id: row for job_id, row in rows.items() if _noted(row)["status"] == TimeoutTask.Status.RUNNING}


# What the status a start leaves says of the lateness policy that ended it.
_ON_LATE = {TimeoutTask.Status.CANCELLED: "skip", TimeoutTask.Status.DEAD: "dead"}


def _noted(row: dict) -> dict:
    """A started row, once a start later than its lateness policy allows is counted (and logged,
    if the policy ended the task rather than run it)."""
    on_late = _ON_LATE.get(row["status"]) or ("run" if row.get("ran_late") else None)
    if on_late is not None:
        lateness = (row["database_now"] - row["run_at"]).total_seconds()
        events.late(row["biz_type"], on_late, lateness)
        if on_late != "run":
            logger.info("timeouts: job %s (%s) %s", row["job_id"], row["biz_type"], row["last_error"])
    return row



def start_now(fence: Fence, database_now) -> Fence | None:
    """The fence of an attempt that its caller runs at once, whatever its run_at: as it is if its
    run_at has come by `database_now` (the database clock); else with its start recorded ahead
    (start_ahead), which run() confirms and then runs the body without waiting, as for a start the
    worker's main process recorded. timeouts.testing.run_due runs so what is due by a later time.
    The row records the start at run_at, as any start ahead: never before. None: the start was
    refused (stale, or cancelled), or ended the task (its lateness policy)."""
    if fence.run_at is None or fence.run_at <= database_now:
        return fence
    ahead = (fence.run_at - database_now).total_seconds()  # the start's clock reads database_now or later
    row = start_ahead(fence.key, fence.attempt, None, ahead)
    if row is None:
        return None
    del row["database_now"]
    return fence.with_started({"row": row, "not_before": time.monotonic()})


def confirm_start(key: dict, attempt: int, partition: str | None = None) -> bool:
    """Whether a start recorded earlier (start_ahead) still holds, its lease renewed for a whole TTR:
    the body may run only then."""
    return attempts.confirm_start(key, attempt, partition)


def _confirmed(fence: Fence, partition, shard):
    """The task of a start recorded ahead (durable/starts.py), if that start still holds. The start
    may be long past: the message may have waited for a pool process. Before the start's
    `holds_until` no statement is needed: only lease recovery takes a started call back, its lease
    cannot have run out yet, and the heartbeat this process keeps from now extends it before it does."""
    holds_until = fence.started.get("holds_until")
    if holds_until is not None and time.monotonic() < holds_until:
        return _started(fence.started["row"], using=shard)
    if not confirm_start(fence.key, fence.attempt, partition):
        return None
    return _started(fence.started["row"], using=shard)


def _started(row: dict, using=DEFAULT_DB_ALIAS) -> TimeoutTask:
    """The task of a start's row. The trace context stored with it (tracing.py), a column the model
    does not declare, goes along for the attempt's span."""
    task = TimeoutTask._from_row(row, using)
    task._trace_context = row.get("trace_context")
    return task


# --- Errors -----------------------------------------------------------------------------------------

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


def stops_the_worker(exc: BaseException) -> bool:
    """Whether `exc` is the worker stopping the attempt rather than the attempt failing: Ctrl-C,
    Celery's shutdown (WorkerShutdown, WorkerTerminate), gevent or eventlet killing the greenlet,
    or anything raised once billiard's SIGTERM handler has run in this pool process (its
    SystemExit, or an error of a cleanup it interrupted: billiard reports no result for that job
    either). Such an attempt has not ended: nothing is recorded, and lease recovery moves it on
    once its lease runs out, as when the worker is killed. Anything else, a SystemExit of the
    code's own (sys.exit(), argparse) or an asyncio.CancelledError included, is the attempt's
    failure, as Django's ImmediateBackend records it."""
    greenlet = sys.modules.get("greenlet")
    return (isinstance(exc, (KeyboardInterrupt, WorkerShutdown, WorkerTerminate))
            or (greenlet is not None and isinstance(exc, greenlet.GreenletExit))
            or terminate_handler_fired())
