"""`manage.py timeouts_partitions`: run partition maintenance now and print what it did."""

import json

from django.core.management.base import BaseCommand

from timeouts.storage import partitions, shards


class Command(BaseCommand):
    help = ("Create the partitions ahead, move rows parked in DEFAULT into new partitions, and drop "
            "partitions past RETENTION that hold no unfinished task. Prints every partition and why.")

    def add_arguments(self, parser):
        parser.add_argument("--dry-run", action="store_true",
                            help="Show what would be created and dropped; change nothing.")
        parser.add_argument("--json", action="store_true", dest="as_json", help="Print the report as JSON.")
        parser.add_argument("--database", help="One shard's alias (default: every shard, TIMEOUTS['SHARDS']).")

    def handle(self, *args, dry_run, as_json, database, **options):
        aliases = [database] if database else list(shards.aliases())
        reports = {alias: partitions.maintain(using=alias, dry_run=dry_run) for alias in aliases}
        if as_json:
            summaries = {alias: report.summary() for alias, report in reports.items()}
            # One database: its report, as it has always been printed; several: by alias.
            self.stdout.write(json.dumps(summaries[aliases[0]] if len(aliases) == 1 else summaries, indent=2))
        else:
            for alias, report in reports.items():
                if len(aliases) > 1:
                    self.stdout.write(f"== shard {alias}")
                self.stdout.write("\n".join(describe(report)))
        failed = sum(len(report.failed) for report in reports.values())
        if failed:
            self.stderr.write(f"{failed} step(s) failed; the next run tries again.")


def describe(report) -> list[str]:
    if report.busy:
        return ["Another partition maintenance is running: nothing done."]
    would = "would be " if report.dry_run else ""
    lines = [f"Partition maintenance at {report.now.isoformat()} (interval: {report.interval})"
             + (" -- DRY RUN, nothing changed" if report.dry_run else "")]
    notes = {}
    for name in report.created:
        notes[name] = f"{would}created ({report.why[name]}), {report.moved_rows[name]} row(s) {would}moved from DEFAULT"
    for name, reason in report.kept.items():
        notes[name] = f"kept past retention: {reason}"
    for name in report.dropped:
        notes[name] = f"{would}dropped ({report.why[name]})"
    for name, error in report.failed.items():
        notes[name] = f"FAILED: {error}"
    lines.append(f"{'partition':<28} {'from':<26} {'to':<26} {'~rows':>10}  action")
    listed = set()
    for p in report.partitions:
        lower = "DEFAULT" if p.is_default else _when(p.lower)
        rows = "?" if p.estimated_rows is None else str(p.estimated_rows)
        note = notes.get(p.name, f"{report.default_rows} row(s) parked" if p.is_default else "unchanged")
        lines.append(f"{p.name:<28} {lower:<26} {_when(p.upper) if not p.is_default else '':<26} {rows:>10}  {note}")
        listed.add(p.name)
    # Dropped partitions, and those a dry run would create, are not in the list above.
    lines += [f"{name:<28} {note}" for name, note in notes.items() if name not in listed]
    lines += [f"skipped {name}: {reason}" for name, reason in report.skipped_overlaps.items()]
    lines.append(f"created {len(report.created)}, moved {report.total_moved} row(s), dropped {len(report.dropped)}, "
                 f"kept past retention {len(report.kept)}, failed {len(report.failed)}, "
                 f"rows in DEFAULT {report.default_rows}")
    return lines


def _when(moment):
    return "-" if moment is None else moment.isoformat()
