"""manage.py timeouts_health: exit 0 with one line when the deployment does its job, else exit 1 with
a line per problem (timeouts/stats/health.py has the checks)."""

import argparse
import json
import math
import sys

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from timeouts.stats import health


def seconds(text) -> float:
    value = float(text)
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a number of seconds above 0, got {text!r}")
    return value


def count(text) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text!r}")
    return value


class Command(BaseCommand):
    help = ("Checks every shard: due tasks waiting too long, nothing claiming while tasks are due, partitions "
            "missing ahead, a shard that cannot be read. Exits 0 with one line when all is well, else 1 with one "
            "line per problem on stderr (--json: one document on stdout).")
    # A probe prints its own lines only, and fast: Django's system checks are `manage.py check`'s business.
    requires_system_checks = []

    def add_arguments(self, parser):
        defaults = health.Thresholds.defaults()
        parser.add_argument("--max-lateness", type=seconds, metavar="SECONDS",
                            help=f"the longest a due task may wait (default {defaults.max_lateness:g})")
        parser.add_argument("--max-claim-gap", type=seconds, metavar="SECONDS",
                            help="the longest nothing may claim while a task has waited that long "
                                 f"(default {defaults.max_claim_gap:g})")
        parser.add_argument("--partitions-ahead", type=count, metavar="N",
                            help="buckets after the current one that must have partitions "
                                 f"(default {defaults.partitions_ahead}: PARTITIONS_AHEAD - 1)")
        parser.add_argument("--timeout", type=seconds, default=health.DEFAULT_TIMEOUT, metavar="SECONDS",
                            help="seconds each shard may take to answer (default %(default)g)")
        parser.add_argument("--database", metavar="ALIAS",
                            help="check this database alone (default: every shard of TIMEOUTS['SHARDS'])")
        probe = parser.add_mutually_exclusive_group()
        probe.add_argument("--liveness", action="store_true",
                           help="only whether anything claims while tasks are due (a shard that cannot be read "
                                "is no failure)")
        probe.add_argument("--readiness", action="store_true", help="only whether every shard can be read")
        parser.add_argument("--json", action="store_true", dest="as_json", help="print one JSON document")

    def handle(self, *args, max_lateness, max_claim_gap, partitions_ahead, timeout, database, liveness, readiness,
               as_json, **options):
        if database is not None and database not in settings.DATABASES:
            raise CommandError(f"unknown database alias {database!r}", returncode=2)
        thresholds = health.Thresholds.defaults(max_lateness=max_lateness, max_claim_gap=max_claim_gap,
                                                partitions_ahead=partitions_ahead, timeout=timeout)
        checks = health.LIVENESS if liveness else health.READINESS if readiness else health.CHECKS
        result = health.check(aliases=database and [database], checks=checks, thresholds=thresholds)
        if as_json:
            self.stdout.write(json.dumps(result.as_dict(), indent=2, default=str))
        elif result.ok:
            self.stdout.write(result.summary())
        else:
            for line in result.lines():
                self.stderr.write(line)
        if not result.ok:
            # As `makemigrations --check` does: the status is the answer, the lines above the reasons.
            sys.exit(1)
