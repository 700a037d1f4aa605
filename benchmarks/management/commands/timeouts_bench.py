"""`manage.py timeouts_bench`: the benchmark. Parses options; the bench lives in benchmarks."""

import argparse
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.test.utils import override_settings

from benchmarks.config import KNOWN_SCENARIOS, PATHS, PEER_SYSTEMS, BenchConfig

SIZES = ("n_spread", "n_burst", "n_drain", "n_single", "n_bulk", "n_idle", "n_durable_spread", "n_durable_memory",
         "n_durable_restart", "n_durable_cost", "n_durable_cpu", "n_tasks_spread", "n_tasks_drain", "n_tasks_enqueue",
         "n_backlog", "n_isolation_spread", "n_rate", "n_claim", "n_shards_drain", "n_shards_outage", "n_debounce",
         "n_late")


def _names(text):
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _count(text):
    """A whole number, also written as 1e7 or 10_000_000."""
    try:
        value = float(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}")
    return int(value)


class Command(BaseCommand):
    help = ("Benchmark timeouts on a database and a Redis database of its own: lateness, missing, duplicate "
            "and early starts, throughput, scheduling rate and idle cost, for the scan-only path, the "
            "dispatcher and Celery itself (optionally the peer harness too). Prints a table, writes JSON.")

    def add_arguments(self, parser):
        d = BenchConfig()
        add = parser.add_argument
        add("--scenarios", type=_names, default=d.scenarios,
            help=f"comma-separated, of {','.join(KNOWN_SCENARIOS)} (default: {','.join(d.scenarios)})")
        add("--paths", type=_names, default=d.paths, help=f"comma-separated, of {','.join(PATHS)}")
        add("--repeat", type=int, default=d.repeat, help="repeats, interleaved across paths; medians reported")
        add("--n", type=int, help="one size for every scenario (a quick run): overrides the --n-* options")
        for name in SIZES:
            add(f"--{name.replace('_', '-')}", dest=name, type=int, default=getattr(d, name))
        add("--window", type=float, default=d.window, help="spread: seconds over which tasks fall due")
        add("--lead", type=float, default=d.lead, help="spread/burst: seconds from scheduling to the first due time")
        add("--bulk-chunk", type=int, default=d.bulk_chunk, help="tasks per bulk_schedule() call")
        add("--restart-from", type=float, default=d.restart_from,
            help="durable_restart: seconds from the first call to the first due time")
        add("--restart-to", type=float, default=d.restart_to, help="durable_restart: ... to the last due time")
        add("--restart-kill-at", type=float, default=d.restart_kill_at,
            help="durable_restart: ... to the kill -9 of every worker process")
        add("--restart-down", type=float, default=d.restart_down,
            help="durable_restart: seconds until a new worker starts")
        add("--outage", type=float, default=d.outage, help="late_recovery: seconds without a worker")
        add("--late-stream", type=float, default=d.late_stream,
            help="late_recovery: seconds of on-time tasks due from the restart")
        add("--late-work-ms", type=float, default=d.late_work_ms,
            help="late_recovery: milliseconds each handler waits, as its I/O would (0: a no-op handler)")
        add("--cpu-rate", type=float, default=d.cpu_rate,
            help="durable_cpu: calls per second of each kind (0: as fast as they go)")
        add("--cpu-idle-seconds", type=float, default=d.cpu_idle_seconds,
            help="durable_cpu: seconds of idle reading before each run, subtracted at its rate (0: none)")
        add("--memory-settle", type=float, default=d.memory_settle,
            help="durable_memory: seconds between the last call held and the RSS reading")
        add("--repo", default="", help="isolation_cost: the git repository to read the previous claim_due from")
        add("--claim-sql-commit", default="",
            help="isolation_cost: the commit whose claim_due to compare with (default: the newest that differs)")
        add("--shards-base-commit", default="",
            help="shards_overhead: the commit to compare with (default: the parent of the one adding shards)")
        add("--debounce-calls", type=int, default=d.debounce_calls, help="debounce: calls per key")
        add("--debounce-writers", type=int, default=d.debounce_writers,
            help="debounce: writer processes making the calls together")
        add("--debounce-block", type=int, default=d.debounce_block,
            help="debounce: keys whose calls a writer makes together, round by round")
        add("--debounce-delay", type=float, default=d.debounce_delay, help="debounce: seconds, each call's delay")
        add("--debounce-max-wait", type=float, default=d.debounce_max_wait,
            help='debounce: seconds, on_conflict="debounce"\'s max_wait')
        add("--scale-rows", type=_count, default=d.scale_rows,
            help="scale: pending tasks loaded due in the partitions ahead (1e7 and 10_000_000 are read too)")
        add("--scale-lead", type=float, default=d.scale_lead,
            help="scale: seconds from the load to the first due time of those tasks (longer than the run)")
        add("--scale-jobs", type=int, default=d.scale_jobs,
            help="scale: connections loading and vacuuming those tasks side by side")
        add("--churn-rate", type=float, default=d.churn_rate, help="scale: tasks the churn schedules per second")
        add("--churn-ahead", type=float, default=d.churn_ahead,
            help="scale: seconds from a churned task's scheduling to its due time")
        add("--churn-cancel", type=float, default=d.churn_cancel,
            help="scale: the share of the churn's tasks cancelled before they fall due")
        add("--drain-timeout", type=float, default=d.drain_timeout,
            help="seconds to wait for a backlog's tasks to start")
        add("--wait-tail", type=float, default=d.wait_tail,
            help="seconds to wait for stragglers after the last due time")
        add("--idle-settle", type=float, default=d.idle_settle)
        add("--idle-seconds", type=float, default=d.idle_seconds)
        add("--scan-interval", type=float, help="the scan loop's interval (default: TIMEOUTS SCAN_INTERVAL)")
        add("--concurrency", type=int, default=d.concurrency, help="Celery worker processes (prefork)")
        add("--celery-app", default=d.celery_app, help="the project's Celery app, as for `celery -A`")
        add("--database", default=d.database, help="the bench's own database (created, migrated, dropped)")
        add("--keep-db", action="store_true", help="keep the bench database afterwards")
        add("--broker-url", default=d.broker_url, help="the bench's own Redis database (it is FLUSHed)")
        add("--json", dest="json_path", default="", help="where to write the JSON (default var/bench/...)")
        add("--markdown", default="", help="also write the results as markdown tables (for the docs' benchmark page)")
        add("--dispatcher-arg", action="append", default=[], dest="dispatcher_args",
            help="an argument for `timeouts_dispatcher` (repeatable)")
        add("--peers", type=_names, default=(),
            help=f"also run the peer harness: comma-separated, of {','.join(PEER_SYSTEMS)}")
        add("--peers-src", default=str(settings.BASE_DIR.parent / "shared" / "bench" / "peers")
            if hasattr(settings, "BASE_DIR") else "", help="the peer harness's files")
        add("--peers-dir", default=d.peers_dir, help="where the harness runs, with its virtualenv")
        add("--peers-redis-url", default=d.peers_redis_url, help="the Redis database the Celery peer may FLUSH")
        add("--pg-log", default="", help="PostgreSQL's log file (for idle queries/s)")
        add("--seed", type=int, default=d.seed)

    def handle(self, *args, **options):
        from benchmarks import runner
        from benchmarks.database import BenchError
        from benchmarks.report import render, render_markdown
        from timeouts.conf import get_settings

        if options["n"]:
            options.update({name: options["n"] for name in SIZES})
        if options["scan_interval"] is None:
            options["scan_interval"] = get_settings().SCAN_INTERVAL
        fields = set(BenchConfig.__dataclass_fields__)
        values = {k: v for k, v in options.items() if k in fields}
        values["dispatcher_args"] = tuple(values["dispatcher_args"])
        try:
            cfg = BenchConfig(**values)
            where = {"settings_module": settings.SETTINGS_MODULE, "root": getattr(settings, "BASE_DIR", None) or ".",
                     "broker_in_use": getattr(settings, "CELERY_BROKER_URL", None)}
            # schedule() runs in this process: measure it without DEBUG's query log, as production runs.
            with override_settings(DEBUG=False):
                result = runner.run(cfg, **where)
        except (ValueError, BenchError) as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(render(result))
        self.stdout.write(f"\nJSON: {result['json_path']}")
        if options["markdown"]:
            Path(options["markdown"]).write_text(render_markdown(result))
            self.stdout.write(f"markdown: {options['markdown']}")
