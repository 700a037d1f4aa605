"""Cheap numbers about the task table, for the admin, `manage.py timeouts_stats` and the metrics.

The table may hold tens of millions of rows, so nothing here counts a large set row by row:

- `count()` counts a queryset exactly only while that is cheap: it asks the planner first what
  counting at most `exact_limit` rows would cost, counts only below `max_cost`, and otherwise (or
  when there are more rows than the limit) answers with the planner's estimate, which comes from the
  catalog and each partition's statistics (`reltuples`, `relpages`, `pg_statistic`).
- `status_counts()` estimates the breakdown by (status, biz_type) from a TABLESAMPLE of the table
  when it is large, and counts exactly the small, indexed groups (DISPATCHED, RUNNING, DEAD).
- The rest reads an index from one end (oldest overdue) or the rows of a short time window
  (recent lateness), pruned to the partitions it needs.
- Per biz_type (`biz_types()`, and the charts of the admin's businesses page): the biz_types with
  PENDING tasks by a loose index scan, then a few statements per biz_type, each stopping at a row
  limit: past it, a count is the planner's estimate and a chart says how far it read.
- Several shards: shard_report.py. The report as text: report_text.py.

The queries are in sql/queries/stats.sql; the admin's counts are its filters' querysets.
"""

import json
import math
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.core.exceptions import EmptyResultSet
from django.db import DEFAULT_DB_ALIAS, connections, transaction
from django.utils import timezone

from timeouts import kinds, registry
from timeouts.states import Status
from timeouts.storage import partitions, shards
from timeouts.store.queries import QUERIES, fetch_dicts, fetch_one

EXACT_LIMIT = 1000  # admin: counts up to this are exact
MAX_COST = 20_000.0  # planner cost units a "cheap" exact count may take (a few ms of work)
EXACT_TABLE_ROWS = 1_000_000  # status_counts(): below this many rows, count exactly
SAMPLE_ROWS = 200_000  # status_counts(): rows to sample above it
SMALL_GROUP_LIMIT = 100_000  # status_counts(): indexed groups counted exactly up to this
# status_counts(): the groups an index serves, few enough to count exactly even in a large table.
INDEXED_STATUSES = (Status.DISPATCHED, Status.RUNNING, Status.DEAD)


@dataclass(frozen=True)
class Count:
    value: int
    exact: bool

    def __str__(self):
        return f"{self.value:,}" if self.exact else f"~{self.value:,}"

    def __add__(self, other):
        """Counts of several shards add up: exact if each one is."""
        return Count(self.value + other.value, self.exact and other.exact)


# --- Counting querysets --------------------------------------------------------------------------

def _sql(queryset):
    compiler = queryset.query.get_compiler(using=queryset.db)
    return compiler.as_sql()


def plan(sql, params, using=DEFAULT_DB_ALIAS) -> dict:
    """The top node of the planner's plan for `sql` (EXPLAIN, nothing is run)."""
    with connections[using].cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + sql, params)
        document = cursor.fetchone()[0]
    if isinstance(document, str):
        document = json.loads(document)
    return document[0]["Plan"]


def count(queryset, *, exact_limit=EXACT_LIMIT, max_cost=MAX_COST) -> Count:
    """How many rows `queryset` has: exact up to `exact_limit` when counting is cheap, else the
    planner's estimate (never below what was counted)."""
    using = queryset.db
    rows = queryset.order_by().values("pk")
    try:
        inner, params = _sql(rows[: exact_limit + 1])
    except EmptyResultSet:  # e.g. queryset.none()
        return Count(0, True)
    bounded = f"SELECT count(*) FROM ({inner}) AS bounded"
    counted = None
    if plan(bounded, params, using)["Total Cost"] <= max_cost:
        with connections[using].cursor() as cursor:
            cursor.execute(bounded, params)
            counted = cursor.fetchone()[0]
        if counted <= exact_limit:
            return Count(counted, True)
    estimate = round(plan(*_sql(rows), using)["Plan Rows"])
    return Count(max(estimate, counted or 0), False)


# --- Raw counts for the command and the metrics --------------------------------------------------

def estimated_rows(name, params=None, using=DEFAULT_DB_ALIAS) -> int:
    """The planner's estimate of the rows named query `name` reads: under its LIMIT if it has one
    (a bounded count), else what it returns. Nothing is run."""
    top = node = plan(QUERIES[name], params or {}, using)
    while node.get("Node Type") != "Limit" and node.get("Plans"):
        node = node["Plans"][0]
    if node.get("Node Type") != "Limit":
        # No LIMIT: what the whole statement returns (its first child, down the tree, would be
        # one partition of an Append).
        return round(top["Plan Rows"])
    return round(node["Plans"][0]["Plan Rows"])


def bounded_count(name, *, limit, using=DEFAULT_DB_ALIAS) -> Count:
    """Run named query `name`, a count of at most its `limit` parameter's rows: exact up to `limit`
    rows, else the planner's estimate. For queries that an index serves (the caller knows): no cost
    guard."""
    params = {"limit": int(limit) + 1}
    counted = fetch_one(name, params, using=connections[using])["n"]
    if counted <= limit:
        return Count(counted, True)
    return Count(max(counted, estimated_rows(name, params, using)), False)


def pending(*, limit=100_000, using=DEFAULT_DB_ALIAS) -> Count:
    return bounded_count("count_pending", limit=limit, using=using)


def overdue(*, limit=100_000, using=DEFAULT_DB_ALIAS) -> Count:
    return bounded_count("count_overdue", limit=limit, using=using)


def default_rows(*, limit=100_000, using=DEFAULT_DB_ALIAS) -> Count:
    return bounded_count("count_default_rows", limit=limit, using=using)


def oldest_overdue(using=DEFAULT_DB_ALIAS) -> dict | None:
    """The PENDING task that has been due longest (by run_at), with `age` (a timedelta), or None."""
    return fetch_one("oldest_overdue", using=connections[using])


def status_counts(*, exact=False, using=DEFAULT_DB_ALIAS):
    """({(status, biz_type): Count}, how): exact GROUP BY for small tables or with `exact`, else a
    TABLESAMPLE scaled up, with the small indexed groups (DISPATCHED, RUNNING, DEAD) counted."""
    connection = connections[using]
    total = estimated_rows("table_rows", using=using)
    if exact or total <= EXACT_TABLE_ROWS:
        rows = fetch_dicts("status_counts", using=connection)
        return {(r["status"], r["biz_type"]): Count(r["n"], True) for r in rows}, "exact"
    percent = min(100.0, 100.0 * SAMPLE_ROWS / total)
    rows = fetch_dicts("sampled_status_counts", {"percent": percent}, using=connection)
    counts = {(r["status"], r["biz_type"]): Count(round(r["n"] * 100.0 / percent), False) for r in rows}
    for status in INDEXED_STATUSES:
        rows = fetch_dicts("status_counts_of_one", {"status": status.value, "limit": SMALL_GROUP_LIMIT + 1},
                           using=connection)
        if sum(r["n"] for r in rows) <= SMALL_GROUP_LIMIT:
            counts = {key: value for key, value in counts.items() if key[0] != status}
            counts.update({(status.value, r["biz_type"]): Count(r["n"], True) for r in rows})
    return counts, f"estimated from a {percent:.3g}% sample of ~{total:,} rows"


def lateness(minutes=15, using=DEFAULT_DB_ALIAS) -> dict:
    """Tasks due in the last `minutes`: how many, how many still wait, and the lateness
    (started_at - action_time, seconds) percentiles of those whose first attempt started."""
    row = fetch_one("lateness", {"window": timedelta(minutes=minutes)}, using=connections[using])
    p50, p90, p99 = row["percentiles"] or (None, None, None)
    return {"minutes": minutes, "due": row["due"], "waiting": row["waiting"], "started": row["started"],
            "p50": p50, "p90": p90, "p99": p99, "max": row["worst"]}


def partition_sizes(using=DEFAULT_DB_ALIAS) -> list[dict]:
    """Every partition with its bounds, estimated rows and size on disk (table + indexes + TOAST)."""
    connection = connections[using]
    found = partitions.list_partitions(connection)
    sizes = {row["name"]: row["bytes"] for row in fetch_dicts("partition_sizes", using=connection)}
    return [{**p.as_dict(), "bytes": sizes.get(p.name)} for p in found]


def human_bytes(n) -> str:
    if n is None:
        return "?"
    for unit in ("B", "kB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def seconds(value) -> str:
    """0.0123 -> '12.3 ms', 75 -> '1 min 15 s'."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if abs(value) < 0.1:
        return f"{value * 1000:.1f} ms"
    if abs(value) < 1:
        return f"{value * 1000:.0f} ms"
    if abs(value) < 120:
        return f"{value:.2f} s"
    minutes, secs = divmod(round(value), 60)
    if minutes < 120:
        return f"{minutes} min {secs} s"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min"
    return f"{hours // 24} d {hours % 24} h"


# --- Per biz_type ---------------------------------------------------------------------------------

BIZ_TYPES_LIMIT = 200  # biz_types read from the table
OVERDUE_LIMIT = 10_000  # overdue tasks counted per biz_type; above it, the planner's estimate
PER_BIZ_TYPE_LIMIT = 10_000  # rows each chart reads per biz_type
RUNNING_LIMIT = 10_000  # claimed and running tasks read, every biz_type's together


@dataclass(frozen=True)
class Buckets:
    """Counts or percentiles per time bucket, oldest first, and how far the query read: buckets
    from `unread[0]` to `unread[1]` (excluded) were not read to their end (its row limit)."""

    start: datetime  # the first bucket's start
    size: timedelta
    values: list
    unread: tuple[int, int] = (0, 0)

    def label(self, i):
        """'19:05-19:10' in the current time zone."""
        begin = timezone.localtime(self.start + i * self.size)
        return f"{begin:%H:%M}-{begin + self.size:%H:%M}"

    @property
    def complete(self):
        return self.unread[0] == self.unread[1]


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
    it noted of each kind (timeouts.kinds: its DurableTask tasks), the biz_types with PENDING tasks
    and those with limits stored; each with its limits and pause (from one read of the limits
    table) and its overdue count at `now`."""
    stored = stored_limits(using=using)
    sources = {}
    for source, names in (("handler", registry.registered()), *kinds.noted().items(),
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


def due_soon(biz_types, now, *, minutes=60, bucket_minutes=5, limit=None,
             using=DEFAULT_DB_ALIAS) -> dict[str, Buckets]:
    """Per biz_type: its PENDING tasks whose run_at falls in each bucket of the next `minutes`,
    from the first `limit` of them (one query per biz_type)."""
    limit = limit or PER_BIZ_TYPE_LIMIT
    size, n = timedelta(minutes=bucket_minutes), minutes // bucket_minutes
    result = {}
    for biz_type in biz_types:
        values, unread = [0] * n, (n, n)
        rows = fetch_dicts("due_soon_of_biz_type", {
            "biz_type": biz_type, "now": now, "window": timedelta(minutes=minutes), "bucket": size.total_seconds(),
            "limit": limit}, using=connections[using])
        for row in rows:
            values[min(row["bucket"], n - 1)] += row["due"]
        if rows and rows[0]["read"] >= limit:  # the bucket of the last task read, and those after it, are partial
            unread = (min(int((rows[0]["last"] - now) / size), n - 1), n)
        result[biz_type] = Buckets(now, size, values, unread)
    return result


def recent_lateness(biz_types, now, *, minutes=15, bucket_minutes=1, limit=None,
                    using=DEFAULT_DB_ALIAS) -> dict[str, Buckets]:
    """Per biz_type: (p50, p99, tasks) of the lateness of the first attempts due in each bucket of
    the last `minutes` (started_at - action_time, or now - action_time for those still waiting to
    start), from the latest `limit` of its tasks in that window (one query per biz_type). A bucket
    without tasks: None."""
    limit = limit or PER_BIZ_TYPE_LIMIT
    size, n = timedelta(minutes=bucket_minutes), minutes // bucket_minutes
    result = {}
    for biz_type in biz_types:
        values, unread = [None] * n, (0, 0)
        rows = fetch_dicts("recent_lateness_of_biz_type", {
            "biz_type": biz_type, "now": now, "window": timedelta(minutes=minutes), "bucket": size.total_seconds(),
            "limit": limit}, using=connections[using])
        for row in rows:
            if row["tasks"]:
                p50, p99 = row["percentiles"]
                values[n - 1 - min(row["bucket"], n - 1)] = (p50, p99, row["tasks"])
        if rows and rows[0]["read"] >= limit:  # the bucket of the oldest row read, and those before it, are partial
            unread = (0, n - min(int((now - rows[0]["first"]) / size), n - 1))
        result[biz_type] = Buckets(now - n * size, size, values, unread)
    return result


# --- The report of manage.py timeouts_stats ------------------------------------------------------

def report(*, exact=False, minutes=15, using=DEFAULT_DB_ALIAS) -> dict:
    now = fetch_one("database_now", using=connections[using])["now"]
    counts, how = status_counts(exact=exact, using=using)
    oldest = oldest_overdue(using)
    limit = None if exact else 100_000
    default = (Count(fetch_one("default_row_count", using=connections[using])["rows"], True) if limit is None
               else default_rows(limit=limit, using=using))
    return {
        "counts": {"how": how, "rows": [
            {"status": Status(status).label, "biz_type": biz_type, "count": c.value, "exact": c.exact}
            for (status, biz_type), c in sorted(counts.items())]},
        "oldest_overdue": oldest and {**oldest, "age_seconds": oldest["age"].total_seconds(),
                                      "age": str(oldest["age"])},
        "default_partition": {"rows": default.value, "exact": default.exact},
        "lateness": lateness(minutes, using),
        "biz_types": [{"biz_type": b.name, "sources": list(b.sources), **vars(b.limits),
                       "overdue": b.overdue.value, "overdue_exact": b.overdue.exact,
                       "running": b.running.value, "running_exact": b.running.exact}
                      for b in biz_types(now, using=using)],
        "partitions": partition_sizes(using),
    }
