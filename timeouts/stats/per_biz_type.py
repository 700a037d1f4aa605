"""Per biz_type, for the admin's businesses page, `timeouts_stats` and the metrics: every biz_type
the deployment knows, with its limits, pause, running and overdue tasks.

The biz_types with PENDING tasks come from a loose index scan, then a few statements per biz_type,
each stopping at a row limit: past it, a count is the planner's estimate.
"""

from contextlib import contextmanager
from dataclasses import dataclass

from django.db import DEFAULT_DB_ALIAS, connections, transaction

from timeouts import registry
from timeouts.stats.counting import Count, estimated_rows
from timeouts.storage import shards
from timeouts.store.queries import fetch_dicts, fetch_one

BIZ_TYPES_LIMIT = 200  # biz_types read from the table
OVERDUE_LIMIT = 10_000  # overdue tasks counted per biz_type; above it, the planner's estimate
RUNNING_LIMIT = 10_000  # claimed and running tasks read, every biz_type's together


def waiting_biz_types(*, limit=None, using=DEFAULT_DB_ALIAS) -> list[str]:
    """The distinct biz_types of the PENDING tasks, the first `limit` in order."""
    rows = fetch_dicts("waiting_biz_types", {"limit": limit or BIZ_TYPES_LIMIT}, using=connections[using])
    return [row["biz_type"] for row in rows]


def stored_limits(*, limit=None, using=DEFAULT_DB_ALIAS) -> dict[str, dict]:
    """The rows of the limits table (timeouts.limiting.controls), by biz_type: `rate_limit` and
    `concurrency` in force, the handler's `declared_*` ones, `overridden`, `paused`, and the shard's
    `rate_part` and `concurrency_part` of the limits (limit_shares.py)."""
    rows = fetch_dicts("stored_limits", {"limit": limit or BIZ_TYPES_LIMIT, **shards.position(using)},
                       using=connections[using])
    return {row["biz_type"]: row for row in rows}


@dataclass(frozen=True)
class BizTypeLimits:
    """What is in force for a biz_type (as timeouts.limits() says), and the handler's own values."""

    rate_limit: float | None  # starts per second; None: no limit
    concurrency: int | None
    paused: bool
    handler_rate_limit: float | None  # what the handler declares (@timeouts.handler)
    handler_concurrency: int | None
    overridden: bool  # set_limits() replaced the handler's values
    # With several shards, what this shard's claims may use of the limits (limit_shares.py).
    rate_part: float | None = None
    concurrency_part: int | None = None


@dataclass(frozen=True)
class BizType:
    name: str
    sources: tuple[str, ...]  # why it is listed: "handler", a kind's label ("DurableTask"), "waiting", "limits"
    limits: BizTypeLimits
    overdue: Count
    running: Count


def biz_types(now, *, using=DEFAULT_DB_ALIAS) -> list[BizType]:
    """Every biz_type the deployment knows, in order: the handlers of this process and the biz_types
    it noted of each kind (timeouts.registry: its DurableTask tasks), the biz_types with PENDING tasks
    and those with limits stored; each with its limits and pause (from one read of the limits
    table) and its overdue count at `now`."""
    stored = stored_limits(using=using)
    sources = {}
    for source, names in (("handler", registry.registered()), *registry.noted_of_kinds().items(),
                          ("waiting", waiting_biz_types(using=using)), ("limits", stored)):
        for name in names:
            sources.setdefault(name, []).append(source)
    names = sorted(sources)
    overdue = overdue_by_biz_type(names, now, using=using)
    running, exact = running_by_biz_type(using=using)
    return [BizType(name, tuple(sources[name]), _limits(name, stored.get(name)), overdue[name],
                    Count(running.get(name, 0), exact)) for name in names]


def running_by_biz_type(*, limit=None, using=DEFAULT_DB_ALIAS) -> tuple[dict[str, int], bool]:
    """RUNNING tasks per biz_type, and whether the counts are exact: they are while at most
    `limit` tasks are claimed or running in all, else lower bounds."""
    limit = limit or RUNNING_LIMIT
    rows = fetch_dicts("running_by_biz_type", {"limit": limit}, using=connections[using])
    return {row["biz_type"]: row["running"] for row in rows}, not rows or rows[0]["read"] < limit


def _limits(biz_type, row) -> BizTypeLimits:
    """From the limits table's row; without one, the handler's own values, unpaused (what
    timeouts.limits() answers, and what the claim applies)."""
    if row is None:
        handler = registry.find_handler(biz_type)
        own = (None, None) if handler is None else (handler.rate_limit, handler.concurrency)
        return BizTypeLimits(*own, False, *own, False)
    parted = len(shards.aliases()) > 1
    return BizTypeLimits(row["rate_limit"], row["concurrency"], row["paused"], row["declared_rate_limit"],
                         row["declared_concurrency"], row["overridden"], row["rate_part"] if parted else None,
                         row["concurrency_part"] if parted else None)


@contextmanager
def counting_in_index_order(using=DEFAULT_DB_ALIAS):
    """A block for count_overdue_of_biz_type: its planner settings (plan_counts_in_index_order)
    hold inside it only. It reads, so it ends in a rollback, which also undoes the settings, in a
    transaction of its own or in a savepoint of the caller's."""
    with transaction.atomic(using=using):
        fetch_one("plan_counts_in_index_order", using=connections[using])
        yield
        transaction.set_rollback(True, using=using)


def overdue_by_biz_type(biz_types, now, *, limit=None, using=DEFAULT_DB_ALIAS) -> dict[str, Count]:
    """PENDING tasks due by `now`, per biz_type: exact up to `limit` each, else the planner's
    estimate (never below what was counted)."""
    limit = limit or OVERDUE_LIMIT
    found = {}
    connection = connections[using]
    with counting_in_index_order(using):
        counts = {biz_type: fetch_one("count_overdue_of_biz_type",
                                      {"biz_type": biz_type, "now": now, "limit": limit + 1}, using=connection)["n"]
                  for biz_type in biz_types}
    for biz_type, counted in counts.items():
        params = {"biz_type": biz_type, "now": now}
        if counted <= limit:
            found[biz_type] = Count(counted, True)
        else:
            found[biz_type] = Count(max(counted, estimated_rows("overdue_of_biz_type", params, using)), False)
    return found
