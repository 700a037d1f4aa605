"""What happened to tasks, announced after it committed: the hook for metrics (and for hosts).

`task_event` is a Django signal, sent with the keyword arguments

- `event`: "scheduled", "dispatched", "started", "done", "retried", "dead", "cancelled" or "late";
- `biz_type`: the handler's name;
- `count`: how many tasks of that biz_type it concerns (claims and cancels come in batches);
- `lateness`: for "started", `started_at - action_time` in seconds of a first attempt, else None;
  for "late", how many seconds after it was due the attempt started;
- `on_late`: for "late" only (else None), the lateness policy that applied: "run", "skip" or "dead".

"late" is an attempt that started later than its biz_type's lateness policy allows
(timeouts.limiting.lateness), or a PENDING task that the claimers' sweep found that late and ended
before it was claimed (dispatch/late_sweep.py). A "skip" or "dead" one ended its task: it is
counted as "cancelled" or "dead" too.

It is sent once the transaction that made the change has committed (at once in autocommit mode,
which is how the scan, the dispatcher and the workers run), so a rolled-back schedule or cancel
is never counted. A receiver that raises is logged, never raised into the code that did the work.

The Prometheus counters (timeouts.metrics) count the same events at the same moment, as a
listener: a function in `listeners`, called directly rather than as a receiver of the signal (with
nobody else listening, Django's signal machinery costs more than the counting itself on
schedule()'s hot path, so the signal is only sent when a host has connected a receiver).
`TimeoutsConfig.ready()` has the metrics listen (`metrics.connect()`); this module knows nothing of
them.

The runtime modules call the small functions below at the point where each change is known to
have happened. Each returns what it was given, so a call wraps an existing expression.
"""

import logging
from collections import Counter
from functools import partial

from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.dispatch import Signal

from timeouts.states import Status

__all__ = ["EVENTS", "task_event"]

logger = logging.getLogger(__name__)

EVENTS = ("scheduled", "dispatched", "started", "done", "retried", "dead", "cancelled", "late")

task_event = Signal()

# Functions called with (event, biz_type, count, lateness) for each event, and on_late= for "late",
# before task_event's receivers. One that raises is logged, as a receiver is.
listeners = []


def listen(listener) -> None:
    """Have `listener` called for each event (once, however many times it is given)."""
    if listener not in listeners:
        listeners.append(listener)


def emit(event, biz_type, count=1, *, lateness=None, using=DEFAULT_DB_ALIAS, on_late=None, connection=None):
    """`connection`: the connection of `using`, when the caller holds it (one look-up less)."""
    # Not has_listeners(): it works out the live receivers, which sending does again.
    if count <= 0 or not (listeners or task_event.receivers):
        return
    if (connection or connections[using]).in_atomic_block:
        transaction.on_commit(partial(_send, event, biz_type, count, lateness, on_late), using=using)
    else:
        _send(event, biz_type, count, lateness, on_late)


def _send(event, biz_type, count, lateness, on_late=None):
    policy = {} if on_late is None else {"on_late": on_late}
    for listener in listeners:
        try:
            listener(event, biz_type, count, lateness, **policy)
        except Exception:
            logger.exception("timeouts: listener %r of the %s event failed", listener, event)
    if not task_event.receivers:
        return
    for receiver, result in task_event.send_robust(
        sender=None, event=event, biz_type=biz_type, count=count, lateness=lateness, on_late=on_late
    ):
        if isinstance(result, Exception):
            logger.error("timeouts: task_event receiver %r failed", receiver, exc_info=result)


# --- Called by the runtime -----------------------------------------------------------------------

def scheduled(task, using=DEFAULT_DB_ALIAS, *, connection=None):
    emit("scheduled", task.biz_type, using=using, connection=connection)
    return task


def scheduled_batch(biz_types, using=DEFAULT_DB_ALIAS):
    for biz_type, count in Counter(biz_types).items():
        emit("scheduled", biz_type, count, using=using)


def dispatched(rows):
    """Rows of the claim query (they carry biz_type)."""
    for biz_type, count in Counter(row["biz_type"] for row in rows).items():
        emit("dispatched", biz_type, count)
    return rows


def started(task, attempt):
    lateness = (task.started_at - task.action_time).total_seconds() if attempt == 1 else None
    emit("started", task.biz_type, lateness=lateness)
    return task


def ran(task, outcome):
    """The outcome string of running.run(): done, retry, dead (lost and dropped are not events)."""
    event = {"done": "done", "retry": "retried", "dead": "dead"}.get(outcome)
    if event:
        emit(event, task.biz_type)
    return outcome


def late(biz_type, on_late, lateness):
    """An attempt that started `lateness` seconds after it was due, later than its lateness policy
    allows (worker/attempt.py); `on_late` says what became of it."""
    emit("late", biz_type, lateness=lateness, on_late=on_late)
    if on_late != "run":
        emit("cancelled" if on_late == "skip" else "dead", biz_type)


def ended_late(rows):
    """Rows of the sweep that ended PENDING tasks later than their lateness policy allows
    (dispatch/late_sweep.py): each is "late", as a late start is, and "cancelled" or "dead"."""
    for row in rows:
        emit("late", row["biz_type"], lateness=row["lateness"], on_late=row["on_late"])
    for (biz_type, on_late), count in Counter((row["biz_type"], row["on_late"]) for row in rows).items():
        emit("cancelled" if on_late == "skip" else "dead", biz_type, count)
    return rows


def cancelled(biz_type, count, using=DEFAULT_DB_ALIAS):
    emit("cancelled", biz_type, count, using=using)
    return count


def cancelled_task(task, done: bool):
    if done:
        emit("cancelled", task.biz_type, using=task._state.db or DEFAULT_DB_ALIAS)
    return done


def cancelled_rows(biz_type, cursor, using=DEFAULT_DB_ALIAS):
    """A cursor that ran a cancelling UPDATE: counts its rows, then closes it."""
    with cursor:
        cancelled(biz_type, max(cursor.rowcount, 0), using=using)


def recovered(rows):
    """Rows of the lease-recovery query: those that became DEAD are counted."""
    for biz_type, count in Counter(row["biz_type"] for row in rows if row["status"] == Status.DEAD).items():
        emit("dead", biz_type, count)
    return rows
