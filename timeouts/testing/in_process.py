"""Running due tasks in the calling process, for the tests of code that schedules them: run_due().

A test schedules tasks in its own transaction (Django's TestCase, pytest-django's `db`), which no
worker can see. run_due() claims them there, on Django's connection to each shard, one at a time,
and runs each through the worker's own path (worker/attempt.py): the compare-and-set start, the
body, then DONE, a retry after its backoff, or DEAD. A handler's task runs as `timeouts.run` runs
it (worker/running.py), a task of Django's tasks framework among them; a kind of work whose work
is something else runs as the kind says (timeouts.registry: a DurableTask call as a worker runs its
message, durable/in_process.py).
"""

from datetime import datetime

from timeouts import events
from timeouts.dispatch.claiming import Claim
from timeouts.errors import InvalidTime
from timeouts.registry import check_known, kind_of
from timeouts.storage import shards
from timeouts.store import claims, clock, worker_connection
from timeouts.validation import describe
from timeouts.worker import attempt, running


def run_due(*, until: datetime | None = None, biz_type: str | None = None) -> int:
    """Run the due tasks here and now, in the caller's transaction; return how many runs were made.

    Every PENDING task due by `until` (an aware datetime) runs, oldest first on each shard, in this
    process, on Django's connection: inside the test's transaction, where it sees what the test
    wrote, and what it writes the test sees. Each goes through the worker's own steps: the
    compare-and-set start, the handler, then DONE; or, if the handler raises, a retry after its
    backoff, or DEAD once its attempts are used up. DurableTask calls and the tasks of Django's
    tasks framework run the same way. What the runs schedule runs too when it is due by `until`.

    - `until`: by default, the database's clock when run_due() is called, and a task that a run
      schedules to be due at once (a delay of 0, a Django task without run_after) runs too. A
      later `until` runs what is due by then at once, as if its time had come: its row records
      its start at its due time, never earlier. A retry runs again when its backoff ends by
      `until`.
    - `biz_type`: only the tasks of this biz_type (a handler's, or a kind's, such as the one a
      DurableTask's calls are stored under).
    - Cancelled tasks and those not due by `until` never run. Neither do the tasks of a paused
      biz_type; rate and concurrency limits do not apply.
    - A naive or non-datetime `until` raises `timeouts.InvalidTime`; a `biz_type` that is not one
      raises `timeouts.InvalidBizType`, one that no handler or kind knows `timeouts.UnknownBizType`.

    With several shards (`TIMEOUTS["SHARDS"]`) every shard's tasks run: a TestCase then lists
    them in `databases`.
    """
    until = _checked(until)
    if biz_type is not None:
        check_known(biz_type)
    bounds = {alias: _bounds(alias, until) for alias in shards.aliases()}
    runs = 0
    claimed = True
    while claimed:  # until a round over the shards finds nothing due: a run may schedule on another shard
        claimed = False
        for alias, (due_by, since) in bounds.items():
            with worker_connection.shared(alias):
                while (claim := _claim(alias, due_by, since, biz_type)) is not None:
                    claimed = True
                    runs += _run(claim)
    return runs


def _checked(until):
    if until is None:
        return None
    if not isinstance(until, datetime):
        raise InvalidTime(f"until must be an aware datetime, got {describe(until)}")
    if until.tzinfo is None or until.utcoffset() is None:
        raise InvalidTime(f"until must be timezone-aware, got the naive datetime {until.isoformat()}: "
                          "use django.utils.timezone.now() or attach a tzinfo")
    return until


def _bounds(alias, until):
    """(due by, scheduled since): a task due by the first, or scheduled since the second to be due
    at once (None: not asked), runs. By default both are the shard's clock now."""
    if until is not None:
        return until, None
    now = clock.database_now(alias)
    return now, now


def _claim(alias, due_by, since, biz_type) -> Claim | None:
    row = claims.claim_oldest_due(alias, due_by, since, biz_type)
    if row is None:
        return None
    events.dispatched([row])
    return Claim(row["job_id"], row["action_time"], row["run_at"], row["biz_type"], row["attempts"] + 1, row["ttr"],
                 row["claimed_at"], row["partition"], row["attribute"], alias)


# Outcomes of an attempt whose body never ran: a stale claim, or a start its lateness policy refused.
NOT_RUN = frozenset({"dropped", "skipped late", "dead late"})


def _run(claim: Claim) -> int:
    """Run one claim on its shard's connection; 1 if its work started, else 0."""
    kind = kind_of(claim.biz_type)
    if kind is not None and kind.run_in_process is not None:
        return int(kind.run_in_process(claim))
    fence = attempt.start_now(claim.fence, claim.claimed_at)
    return 0 if fence is None else int(running.run(fence) not in NOT_RUN)
