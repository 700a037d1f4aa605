"""Numbers about the whole task table, for `manage.py timeouts_stats` and the metrics, each one
bounded statement: how many wait and are overdue, the oldest overdue task, the breakdown by
(status, biz_type), the recent lateness, the partitions' sizes.

`status_counts()` estimates the breakdown from a TABLESAMPLE of the table when it is large, and
counts exactly the small, indexed groups (DISPATCHED, RUNNING, DEAD). The rest reads an index from
one end (oldest overdue) or the rows of a short time window (recent lateness), pruned to the
partitions it needs.
"""

from datetime import timedelta

from django.db import DEFAULT_DB_ALIAS, connections

from timeouts.states import Status
from timeouts.stats.counting import Count, bounded_count, estimated_rows
from timeouts.storage import partitions
from timeouts.store.queries import fetch_dicts, fetch_one

EXACT_TABLE_ROWS = 1_000_000  # status_counts(): below this many rows, count exactly
SAMPLE_ROWS = 200_000  # status_counts(): rows to sample above it
SMALL_GROUP_LIMIT = 100_000  # status_counts(): indexed groups counted exactly up to this
# status_counts(): the groups an index serves, few enough to count exactly even in a large table.
INDEXED_STATUSES = (Status.DISPATCHED, Status.RUNNING, Status.DEAD)


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
