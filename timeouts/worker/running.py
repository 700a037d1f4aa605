"""The worker side of `timeouts.run`: a handler's attempt, through the one fenced path (attempt.py).

A handler's kind of work: its body is the biz_type's handler, called with the task; any error it
raises is retried after a backoff, or makes the task DEAD once its attempts are used up; its DONE
is finish_task's, which a batch writes in one statement with its next task's start (batches.py).
"""

from timeouts.models import TimeoutTask
from timeouts.protocol import Fence
from timeouts.registry import get_handler
from timeouts.store import attempts
from timeouts.worker import attempt, leases
from timeouts.worker.attempt import Done


class Handler(attempt.Kind):
    joins_next_start = True

    def keeps_lease(self) -> bool:
        # A pool that cannot stop the handler at its hard time limit (the TTR) keeps its lease instead.
        return not leases.pool_stops_handlers()

    def call(self, task, fence):
        get_handler(task.biz_type)(task)

    def record(self, done: Done):
        key, number = done.fence.key, done.fence.attempt
        if done.ending.outcome == "done":
            return attempts.finish(key, number, done.partition)
        return attempts.fail(key, number, done.ending.error, attempt.backoff_seconds(number))

    def outcome(self, done: Done, row: dict) -> str:
        if done.ending.outcome == "done":
            return "done"
        return "dead" if row["status"] == TimeoutTask.Status.DEAD else "retry"


HANDLER = Handler()


def run(fence: Fence, lease_extra: float = 0.0) -> str:
    """Run the attempt of `fence` if its message still owns it; returns what happened: done, retry,
    dead, lost (its lease ran out meanwhile), dropped (a stale message), or skipped late or dead late
    (its lateness policy ended the task instead: nothing ran). `lease_extra`: seconds of lease
    beyond the TTR (a batch's time limit is longer than one TTR)."""
    _, outcome, done = run_leaving_done(fence, lease_extra)
    return outcome if done is None else finish(done)


def run_leaving_done(fence: Fence, lease_extra: float = 0.0, previous: Done | None = None):
    """run(), except that a handler that returns leaves its DONE to the caller, who writes it with
    finish() or passes it on as the next task's `previous`: then one statement writes it and starts
    that task. Returns (previous's outcome, this task's outcome or None, this task's Done or None)."""
    return attempt.run(HANDLER, fence, lease_extra, previous)


finish = attempt.finish
