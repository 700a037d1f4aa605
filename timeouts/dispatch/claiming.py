"""Claiming due tasks: the one code path shared by the beat-triggered scan and the dispatcher.

A claim is a short transaction of its own (`UPDATE ... FROM (SELECT ... FOR UPDATE SKIP LOCKED)`),
committed before anything is published, so a claimer never holds row locks across broker I/O, and
two claimers never get the same task.
"""

import contextlib
from dataclasses import dataclass
from datetime import datetime

from django.db import DEFAULT_DB_ALIAS, Error
from django.db.transaction import TransactionManagementError

from timeouts import events, protocol, registry
from timeouts.conf import get_settings
from timeouts.storage import shards
from timeouts.store import worker_connection
from timeouts.store.claims import claim_rows, release_rows
from timeouts.store.serialization import retry_on_conflict
from timeouts.testing import faults


@dataclass(frozen=True)
class Claim:
    job_id: int
    action_time: datetime
    run_at: datetime
    biz_type: str
    attempt: int  # the attempt this dispatch will be, if it starts
    ttr: int
    claimed_at: datetime  # database clock
    partition: str  # the partition that held the row when it was claimed
    call: object = None  # a stored Celery call's attribute (JSON), which its message is made of
    shard: str = DEFAULT_DB_ALIAS  # the alias of the database that holds the row
    biz_id: str = ""
    trace_context: str | None = None  # what scheduling stored of its trace (tracing.py), for the dispatch's span

    @property
    def eta(self):
        """Claimed ahead of time (the dispatcher's lead): the worker should start it at run_at."""
        return self.run_at if self.run_at > self.claimed_at else None

    @property
    def fence(self) -> protocol.Fence:
        """What its message carries (protocol.py)."""
        return protocol.Fence(self.job_id, self.action_time, self.attempt, self.partition, self.shard, self.run_at)

    def message_args(self):
        """What `timeouts.run` receives."""
        return protocol.run_args(self.fence)

    def message_kwargs(self):
        """The keyword arguments of its `timeouts.run` or `timeouts.run_batch` message."""
        return protocol.run_kwargs(self.fence)

    def batch_item(self):
        """One task of a `timeouts.run_batch` message."""
        return protocol.batch_item(self.fence)


# The most one claim takes, whatever it is asked for: the claim's plan is sized for it (see
# claim_due in sql/queries/claims.sql). A scan or dispatcher with a larger batch claims it in rounds.
MAX_CLAIM = 5000


def claim_due(limit: int, lead: float = 0.0) -> list[Claim]:
    """Claim up to `limit` (at most MAX_CLAIM) PENDING tasks due within `lead` seconds, by the
    database clock: shared fairly among their biz_types, within their limits and pauses
    (timeouts.limiting.controls)."""
    if worker_connection.current().in_atomic_block:
        raise TransactionManagementError(
            "claim_due() must commit before publishing: call it outside transaction.atomic()")
    shard = worker_connection.current().alias
    params = {"limit": min(limit, MAX_CLAIM), "lead": float(lead), "max_dispatched": get_settings().MAX_DISPATCHED,
              "attribute_prefixes": registry.attribute_prefixes(),
              **shards.position(shard)}

    def claim():
        return claim_rows(params)

    if faults.ARMED and faults.armed("claim.before_commit"):
        claim = _faulting_before_commit(claim)  # tests only: never a transaction when unarmed
    rows = events.dispatched(retry_on_conflict(claim, using=shard))
    if rows:
        faults.fault("claim.after_commit")
    return sorted(
        (
            Claim(
                row["job_id"], row["action_time"], row["run_at"], row["biz_type"], row["attempts"] + 1, row["ttr"],
                row["claimed_at"], row["partition"], row["call"], shard, row["biz_id"], row["trace_context"],
            )
            for row in rows
        ),
        key=lambda claim: claim.run_at,
    )


def _faulting_before_commit(claim):
    """The claim inside a transaction, with the `claim.before_commit` fault point before its commit."""

    def claim_then_fault():
        db = worker_connection.current()  # a dispatcher's own, which transaction.atomic() cannot take
        db.set_autocommit(False)
        committed = False
        try:
            rows = claim()
            if rows:
                faults.fault("claim.before_commit")
            db.commit()
            committed = True
            return rows
        finally:
            with contextlib.suppress(Error):  # a broken connection is closed by the claimer's fault handling
                if not committed:
                    db.rollback()
                db.set_autocommit(True)

    return claim_then_fault


def release(claims):
    """Give claims back to PENDING at once (their messages were not published), each on its shard."""
    by_shard = {}
    for claim in claims:
        by_shard.setdefault(claim.shard, []).append(claim)
    for shard, shard_claims in by_shard.items():
        release_rows(shard, [c.job_id for c in shard_claims], [c.action_time for c in shard_claims])
