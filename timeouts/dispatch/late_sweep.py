"""Ending the PENDING tasks that their lateness policy would end at their start, before anyone
claims them: the dispatcher's and the scan's sweep.

A task more than its biz_type's max_lateness past the time it was due, with on_late "skip" or
"dead" (timeouts.limiting.lateness), would be ended by the worker's start however soon it is
claimed. After an outage or behind a backlog there may be thousands of them, each of which would
take a claim, a message and a start, in the same queue as the work that must still run. The sweep
ends them where they lie, a batch per statement (end_late_pending, sql/queries/claims.sql), as
their start would: CANCELLED or DEAD, the same last_error, the same events. The start still
decides for a task that becomes late after it was claimed. Nothing is read or written beyond the
tiny limits table unless some biz_type has such a policy; a dispatcher, which reads the smallest
such max_lateness with its nearest deadline, not even that, and sweeps only once its oldest
waiting task may be that late.

A paused biz_type's tasks are left as they are: nothing is claimed while it is paused, and its
operator may change the policy before resuming it.
"""

import logging
import time
from collections import Counter

from django.db.transaction import TransactionManagementError

from timeouts import events
from timeouts.store import worker_connection
from timeouts.store.claims import end_late_rows, smallest_late_policy

logger = logging.getLogger(__name__)

# Seconds between two sweeps of a dispatcher: a late task waits at most this much longer, and
# meanwhile it is only claimed if a claim reaches it first (its start then ends it).
SWEEP_INTERVAL = 1.0
# Seconds before the next sweep when one ended all it could take: claims get their turn in between.
SWEEP_AGAIN = 0.05
# The most one statement ends (each of a biz_type's oldest, all biz_types together).
MAX_ENDED = 5000


def end_late(limit: int = MAX_ENDED, min_lateness: float | None = None) -> int:
    """End up to `limit` PENDING tasks of this thread's shard that are later than their lateness
    policy allows (on_late "skip": CANCELLED, "dead": DEAD); returns how many it ended.
    `min_lateness`: the smallest max_lateness of those policies, in seconds, if the caller has read
    it (else it is read here)."""
    if worker_connection.current().in_atomic_block:
        raise TransactionManagementError("end_late() runs in autocommit: call it outside transaction.atomic()")
    if min_lateness is None:
        min_lateness = smallest_late_policy()
    if min_lateness is None:
        return 0
    rows = events.ended_late(end_late_rows(min_lateness, limit))
    for (biz_type, on_late), count in Counter((row["biz_type"], row["on_late"]) for row in rows).items():
        logger.info("timeouts: %d PENDING task%s of %s ended over their max_lateness (on_late=%s), not run",
                    count, "" if count == 1 else "s", biz_type, on_late)
    return len(rows)


def end_late_until(deadline: float, limit: int = MAX_ENDED) -> int:
    """end_late() batch after batch while batches come back full, until time.monotonic() passes
    `deadline` (the scan's)."""
    ended = 0
    while True:
        batch = end_late(limit)
        ended += batch
        if batch < limit or time.monotonic() > deadline:
            return ended


class Sweeper:
    """When a dispatcher sweeps: while some waiting task may be later than a policy that ends it
    allows (as note() was last told), every SWEEP_INTERVAL, and SWEEP_AGAIN after a full sweep."""

    def __init__(self, clock=time.monotonic, interval=SWEEP_INTERVAL, limit=MAX_ENDED):
        self.clock, self.interval, self.limit = clock, interval, limit
        self.next_at = clock()
        self.min_lateness = None  # seconds: the smallest max_lateness of the policies that end tasks
        self.late_from = None  # local clock: when the oldest waiting task becomes that late

    def note(self, oldest: float | None, min_lateness: float | None):
        """What the dispatcher's read of its nearest deadline says: the oldest waiting task's due
        time (on the local clock; None: none waits) and the smallest such max_lateness (None: no
        biz_type has a policy that ends tasks)."""
        self.min_lateness = min_lateness
        self.late_from = None if oldest is None or min_lateness is None else oldest + min_lateness

    @property
    def wake_at(self) -> float | None:
        """When the next sweep is due (local clock), or None."""
        return None if self.late_from is None else max(self.next_at, self.late_from)

    def due(self, now) -> bool:
        return self.wake_at is not None and now >= self.wake_at

    def sweep(self) -> int:
        ended = end_late(self.limit, self.min_lateness)
        self.next_at = self.clock() + (SWEEP_AGAIN if ended >= self.limit else self.interval)
        return ended
