"""manage.py timeouts_stats: what the task table holds, cheaply (see timeouts/stats.py)."""

import json

from django.core.management.base import BaseCommand

from timeouts import stats


class Command(BaseCommand):
    help = ("Counts by status and biz_type (estimated on large tables unless --exact), the oldest overdue task, "
            "rows in the DEFAULT partition, recent lateness percentiles, each biz_type's limits, pause and overdue "
            "tasks, and the partitions with their sizes.")

    def add_arguments(self, parser):
        parser.add_argument("--exact", action="store_true", help="count every row (slow on large tables)")
        parser.add_argument("--minutes", type=int, default=15, help="lateness of tasks due in the last N minutes")
        parser.add_argument("--json", action="store_true", dest="as_json", help="print one JSON document")
        parser.add_argument("--database", default="default")

    def handle(self, *args, exact, minutes, as_json, database, **options):
        report = stats.report(exact=exact, minutes=minutes, using=database)
        self.stdout.write(json.dumps(report, indent=2, default=str) if as_json else stats.format_report(report))
