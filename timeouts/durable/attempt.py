"""The worker side of a stored Celery call (`DurableTask`): its attempt, through the worker's one
fenced path (worker/attempt.py).

A call's kind of work: its body is the Celery task's own, called with the message's arguments. Its
ending is end_call's: DONE when the task returned, raised Retry (the retry is a call of its own,
with the same task_id) or Ignore; DEAD with the reason when it raised Reject or anything else. The
error then goes on to Celery, which records the task's state as usual. Its statements go to its
shard on the worker's own connection, the body runs outside them. A start recorded ahead by the
worker's main process (durable/starts.py) is confirmed before the body runs, which waits for run_at
by the database clock.
"""

import logging
import time
import traceback
from datetime import timedelta

from celery.exceptions import Ignore, Reject, Retry

from timeouts.durable import calls as celery_calls
from timeouts.protocol import ETA_HEADROOM, Fence
from timeouts.states import Status
from timeouts.store import attempts, worker_connection
from timeouts.worker import attempt
from timeouts.worker.attempt import DONE, NOT_RECORDED, Done, Ending

logger = logging.getLogger(__name__)


class Call(attempt.Kind):
    """One message of a call: `body(*args, **kwargs)` is the Celery task's own __call__."""

    # Not started ahead (received late, or the main process's start did not answer in time): a
    # call claimed ahead still reaches its pool process ETA_HEADROOM before its eta, its start is
    # recorded then, and start() returns at the eta by the database clock.
    ahead = ETA_HEADROOM.total_seconds()
    reraises = True

    def __init__(self, task, body, args, kwargs):
        self.task, self.body, self.args, self.kwargs = task, body, args, kwargs
        self.value = None

    def database(self, fence: Fence):
        return worker_connection.used(fence.shard)

    def dropped(self, fence: Fence):
        if fence.started is not None:
            logger.warning("timeouts: dropped %s[%s] (job %s attempt %s): its start, recorded ahead, no "
                           "longer holds (its lease ran out while it waited for a process)",
                           self.task.name, self.task.request.id, fence.job_id, fence.attempt)
        else:
            logger.info("timeouts: dropped a stale message of %s[%s] (job %s attempt %s)",
                        self.task.name, self.task.request.id, fence.job_id, fence.attempt)
        raise Ignore()

    def ended_late(self, row, fence: Fence):
        """Its start came later than the lateness policy of its biz_type allows, which ended it
        (timeouts.limiting.lateness; its `expires` is Celery's own, applied when it is published):
        nothing ran, and Celery records nothing, as for a dropped message."""
        logger.warning("timeouts: %s[%s] (job %s) %s", self.task.name, self.task.request.id, fence.job_id,
                       row.last_error)
        raise Ignore()

    def ready(self, row, fence: Fence):
        if fence.started is not None:
            _wait_until(fence.started["not_before"], row)

    def call(self, row, fence: Fence):
        self.value = self.body(*self.args, **self.kwargs)

    def ending(self, row, exc: BaseException) -> Ending:
        if isinstance(exc, Retry):
            return Ending("done", f"retried: {exc}")
        if isinstance(exc, Ignore):  # the task asked Celery to record nothing (Task.replace() does so too)
            return DONE
        if isinstance(exc, Reject):
            # Rejected, also when a retry could not be sent: the call did not complete. A message
            # Celery requeues would find its row ended, so the row is left for an operator to requeue.
            return Ending("dead", f"rejected: {exc.reason!r}")
        return Ending("dead", traceback.format_exc())  # a sys.exit() of the task's own too

    def record(self, done: Done):
        """A failure to record is logged, not raised: the task's own outcome stands, and the row's
        lease runs out (the call runs again: at least once)."""
        status = Status.DONE if done.ending.outcome == "done" else Status.DEAD
        try:
            return attempts.end_call(done.fence.key, done.fence.attempt, status, attempt.error_text(done.ending.error),
                                     done.task.started_at, done.partition)
        except Exception:
            logger.exception("timeouts: could not record the outcome of %s", done.task)
            return NOT_RECORDED


def run(task, fence: Fence, body, args, kwargs):
    """Run the call's attempt that `fence` owns; its body's value, or its error once recorded.
    Raises Ignore for a message that owns no attempt."""
    call = Call(task, body, args, kwargs)
    _, _, done = attempt.run(call, fence)
    attempt.finish(done)
    return call.value


def _wait_until(not_before, row):
    """Until the call's run_at by the database clock (`not_before`, in time.monotonic()), then its
    started_at: its start was recorded as at run_at, but the body starts now, later if it waited for a
    process. That is its lateness, and its started_at once its outcome is recorded."""
    wait = not_before - time.monotonic()
    if wait > 0:
        time.sleep(wait)
    row.started_at = row.run_at + timedelta(seconds=max(0.0, time.monotonic() - not_before))


def end_timed_out(task_id, shard, exc):
    """Celery killed the call `task_id` at its hard time limit (the worker's main process reports
    it, without the message's fence): DEAD, as Celery records a FAILURE."""
    from timeouts import events

    try:
        with worker_connection.used(shard):
            rows = attempts.end_timed_out_call(task_id, celery_calls.PREFIX, f"killed: {exc!r}")
    except Exception:
        logger.exception("timeouts: could not record that call %s was killed at its time limit", task_id)
        return
    for row in rows:
        events.emit("dead", row["biz_type"])
