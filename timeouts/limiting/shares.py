"""Limits across shards: each shard's part of a biz_type's deployment-wide limits.

Every shard claims from its own table in a statement of its own (claim_due), so a limit held whole
on each would let N shards start N times the limit. Each shard's row of timeouts_limits says instead
what part of the limit in force its claims may use, as a fraction of it
(sql/migrations/0001_limits.sql): even parts until the scan first shares them out, then parts after
each shard's demand that add up to at most the whole:

- a rate: a tenth of it in even parts, so that a shard with nothing due still starts a new task at
  once, and the rest in proportion to the tasks due on each shard within the next SCAN_INTERVAL;
- a concurrency: each shard keeps what it runs; the rest goes to the shards with due tasks, in
  proportion to them, and what they cannot use in even parts to all.

Parts that go down are written before parts that go up, so that they never add up to more than the
whole, even between the writes. A concurrency part is never lowered below what its shard runs: its
row is locked first (the shard's claims of that biz_type skip it meanwhile), then the tasks claimed
or running there are counted. The scan shares the limits out (share_limits()) holding an advisory
lock on the first shard, so two scans never interleave their writes. A shard that cannot be read
stops the sharing: the parts stay as they were, which is within the limits, until the next scan.
"""

import math
from dataclasses import dataclass

from django.db import connections, transaction
from django.utils import timezone

from timeouts.conf import get_settings, notify_params
from timeouts.storage import shards
from timeouts.store.queries import execute, fetch_dicts, fetch_one

# Of a rate, the part split evenly among the shards whatever their demand.
RESERVE = 0.1
# Due tasks counted per biz_type and shard: enough to weigh the shards, bounded in cost.
DUE_CAP = 10_000
# Two-key advisory lock on the first shard: "shar", then this lock.
LOCK_NAMESPACE, LOCK_KEY = 0x73686172, 1


@dataclass(frozen=True)
class Demand:
    """One biz_type on one shard, as limit_demand reads it."""

    rate_limit: float | None
    concurrency: int | None
    rate_share: float | None
    concurrency_share: float | None
    # This shard's part of the concurrency, in tasks, as its claims read it (timeouts_concurrency_part).
    concurrency_part: int | None
    in_flight: int
    due: int


def share_limits() -> int:
    """Share every limited biz_type's limits out among the shards after their demand; returns how
    many parts changed. Does nothing with one shard, or while another scan is sharing them."""
    aliases = shards.aliases()
    if len(aliases) == 1:
        return 0
    first = connections[aliases[0]]
    lock = {"namespace": LOCK_NAMESPACE, "key": LOCK_KEY}
    if not fetch_one("try_maintenance_lock", lock, using=first)["locked"]:
        return 0
    try:
        return _share(aliases)
    finally:
        execute("release_maintenance_lock", lock, using=first).close()


def _share(aliases) -> int:
    horizon = get_settings().SCAN_INTERVAL
    demands = {alias: {row.pop("biz_type"): Demand(**row)
                       for row in fetch_dicts("limit_demand",
                                              {"horizon": horizon, "cap": DUE_CAP, **shards.position(alias)},
                                              using=connections[alias])}
               for alias in aliases}
    plans, concurrency = {}, {}
    for biz_type in set().union(*demands.values()):
        on_each = [demands[alias].get(biz_type) for alias in aliases]
        # Every shard must know the biz_type's limits, and the same ones: a shard that has not
        # declared them yet, or a change written to some shards only, waits for the next scan.
        if None not in on_each and len({(d.rate_limit, d.concurrency) for d in on_each}) == 1:
            plans[biz_type] = dict(zip(aliases, _new_parts(on_each), strict=True))
            concurrency[biz_type] = on_each[0].concurrency
    lowered = {alias: {} for alias in aliases}
    for biz_type, parts in plans.items():
        for alias, part in parts.items():
            down = {change: new for change, (new, current) in part.items() if new < current}
            if down:
                lowered[alias][biz_type] = down
    for alias in aliases:
        _lower(alias, lowered[alias], concurrency)
    raised = {alias: {} for alias in aliases}
    for biz_type, parts in plans.items():
        for alias, up in _raised(parts, {alias: lowered[alias].get(biz_type, {}) for alias in aliases},
                                 concurrency[biz_type]).items():
            raised[alias][biz_type] = up
    for alias in aliases:
        _raise(alias, raised[alias], concurrency)
    return sum(len(parts) for parts in (*lowered.values(), *raised.values()))


def _raised(parts, lowered, limit) -> dict:
    """Of one biz_type's parts, those that go up, by shard: a concurrency part within what the
    shards hold once the lowered ones are written (no lower than what each runs)."""
    room = 0
    if limit is not None:
        room = limit - sum(lowered[alias].get("concurrency", part["concurrency"][1]) for alias, part in parts.items())
    raised = {}
    for alias, part in parts.items():
        up = {change: new for change, (new, current) in part.items() if new > current}
        if "concurrency" in up:
            current = part["concurrency"][1]
            more = min(up.pop("concurrency") - current, max(0, room))
            room -= more
            if more:
                up["concurrency"] = current + more
        if up:
            raised[alias] = up
    return raised


def _new_parts(on_each: list[Demand]) -> list[dict]:
    """Per shard, {"rate" and/or "concurrency": (new part, current part)}: rate parts as fractions
    (a change within rounding is none), concurrency parts as numbers of tasks."""
    count, limits = len(on_each), on_each[0]
    parts = [{} for _ in on_each]
    if limits.rate_limit is not None:
        for part, new, d in zip(parts, rate_parts([d.due for d in on_each]), on_each, strict=True):
            current = 1 / count if d.rate_share is None else d.rate_share
            part["rate"] = (current if math.isclose(new, current, rel_tol=1e-6) else new, current)
    if limits.concurrency is not None:
        new = concurrency_parts(limits.concurrency, [d.in_flight for d in on_each], [d.due for d in on_each])
        for part, tasks, d in zip(parts, new, on_each, strict=True):
            part["concurrency"] = (tasks, d.concurrency_part)
    return parts


def rate_parts(dues: list[int]) -> list[float]:
    """Each shard's fraction of a rate: RESERVE in even parts, the rest after the tasks due."""
    count, total = len(dues), sum(dues)
    if total == 0:
        return [1 / count] * count
    return [RESERVE / count + (1 - RESERVE) * due / total for due in dues]


def concurrency_parts(limit: int, in_flight: list[int], dues: list[int]) -> list[int]:
    """Each shard's number of tasks of a concurrency limit: what it runs, then the rest of the
    limit, first to the shards with due tasks (in proportion, up to their due tasks), then evenly."""
    parts = list(in_flight)
    free = limit - sum(in_flight)
    if free <= 0:
        return parts
    wanted = [min(due, free * due // max(1, sum(dues))) for due in dues]
    # What the proportional floors leave, to the shards whose due tasks are not all covered yet.
    for index in sorted(range(len(dues)), key=lambda i: dues[i] - wanted[i], reverse=True):
        if sum(wanted) < free and wanted[index] < dues[index]:
            wanted[index] += 1
    rest = free - sum(wanted)
    for index in range(len(parts)):
        parts[index] += wanted[index] + rest // len(parts) + (1 if index < rest % len(parts) else 0)
    return parts


def _lower(alias, parts, concurrency):
    """Write the parts that go down, a concurrency part no lower than what the shard runs now
    (`parts` then holds what was written)."""
    if not parts:
        return
    db = connections[alias]
    with transaction.atomic(using=alias):
        execute("lock_limits_rows", {"biz_types": sorted(parts)}, using=db).close()
        running = {row["biz_type"]: row["n"] for row in fetch_dicts("in_flight_by_biz_type", using=db)}
        for biz_type, part in parts.items():
            if "concurrency" in part:
                part["concurrency"] = max(part["concurrency"], running.get(biz_type, 0))
        _write(db, parts, concurrency)


def _raise(alias, parts, concurrency):
    """Write the parts that go up, and wake the shard's dispatchers: a larger part may start tasks
    they are sleeping on."""
    if not parts:
        return
    db = connections[alias]
    _write(db, parts, concurrency)
    execute("notify_deadline", {"deadline": timezone.now(), **notify_params()}, using=db).close()


def _write(db, parts, concurrency):
    """Rate parts as they are (fractions), concurrency parts from tasks to fractions of the limit."""
    biz_types = sorted(parts)
    execute("set_limit_shares", {
        "biz_types": biz_types,
        "rate_shares": [parts[b].get("rate") for b in biz_types],
        "concurrency_shares": [None if "concurrency" not in parts[b] else parts[b]["concurrency"] / concurrency[b]
                               for b in biz_types],
    }, using=db).close()
