"""The report of `manage.py timeouts_stats` on one database, as a dict (JSON with --json): its
whole-table numbers and its biz_types. Several shards: shard_totals.py; as text: text_report.py."""

from django.db import DEFAULT_DB_ALIAS, connections

from timeouts.states import Status
from timeouts.stats.counting import Count
from timeouts.stats.per_biz_type import biz_types
from timeouts.stats.whole_table import default_rows, lateness, oldest_overdue, partition_sizes, status_counts
from timeouts.store.queries import fetch_one


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
