"""manage.py timeouts_stats: what the task table holds, cheaply (timeouts/stats/), on every shard
(timeouts/stats/shard_totals.py)."""

import json

from django.core.management.base import BaseCommand, CommandError

from timeouts import stats
from timeouts.stats import shard_totals, text_report
from timeouts.storage import shards


class Command(BaseCommand):
    help = ("Counts by status and biz_type (estimated on large tables unless --exact), the oldest overdue task, "
            "rows in the DEFAULT partition, recent lateness percentiles, each biz_type's limits, pause and overdue "
            "tasks, and the partitions with their sizes. With several shards: the totals, then each shard's "
            "numbers; exits with status 1 when a shard cannot be read (after printing the others).")

    def add_arguments(self, parser):
        parser.add_argument("--exact", action="store_true", help="count every row (slow on large tables)")
        parser.add_argument("--minutes", type=int, default=15, help="lateness of tasks due in the last N minutes")
        parser.add_argument("--json", action="store_true", dest="as_json", help="print one JSON document")
        parser.add_argument("--database", default=None,
                            help="one database's report (default: every shard of TIMEOUTS['SHARDS'])")

    def handle(self, *args, exact, minutes, as_json, database, **options):
        aliases = (database,) if database else shards.aliases()
        if len(aliases) == 1:
            report = stats.report(exact=exact, minutes=minutes, using=aliases[0])
        else:
            report = shard_totals.report_of_shards(aliases, exact=exact, minutes=minutes)
        self.stdout.write(json.dumps(report, indent=2, default=str) if as_json else text_report.format_report(report))
        unread = shard_totals.unread_shards(report)
        if unread:
            # Everything that could be read is printed above; the status tells a script or a
            # monitor that the totals leave some shards out.
            raise CommandError(f"could not read the shards {', '.join(unread)}: the totals leave them out")
