"""Per biz_type, over the minutes around now: its tasks due in each time bucket ahead, and the
lateness of those due in each bucket behind (the charts of the admin's businesses page). Each is one
statement per biz_type that stops at a row limit, and says how far it read.
"""

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import DEFAULT_DB_ALIAS, connections
from django.utils import timezone

from timeouts.store.queries import fetch_dicts

PER_BIZ_TYPE_LIMIT = 10_000  # rows each chart reads per biz_type


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
