"""scale: the dispatcher's spread lateness and drain with N pending tasks due in the partitions
ahead, against an empty table, without and with a steady churn of scheduled-then-cancelled tasks.

One repeat, on one worker (`concurrency` processes), the dispatcher started afresh for each phase:

1. `empty`: the task table empty: spread (N_SPREAD tasks scheduled one by one, due over the window:
   lateness) then drain (N_DRAIN tasks already due when the dispatcher starts: handler starts per
   second), as the spread and drain scenarios measure them on the dispatcher path;
2. `empty_churn`: the same while a churn writer (benchmarks.churn_writer) schedules `churn_rate`
   tasks a second through timeouts.schedule(), each due `churn_ahead` seconds later, and cancels
   `churn_cancel` of them through timeouts.cancel() before they fall due; the others run. The churn
   runs `churn_ahead` seconds before the spread starts, so cancels and due survivors are steady;
3. the background: `scale_rows` PENDING tasks loaded straight in SQL into the project's partitions
   (maintain() first), due from `scale_lead` seconds after the load to the end of the last partition
   ahead, then VACUUM ANALYZEd and checkpointed (scale_load.py): the load's time and the table's
   size on disk;
4. `loaded` and `loaded_churn`: 1 and 2 again with the background in place.

The two states without churn and the two with it swap places in odd repeats. Before each phase the
previous phase's tasks are deleted and the current partition is VACUUM ANALYZEd, as autovacuum
would keep a small, busy partition; during a phase nothing vacuums, as within minutes on a large
table nothing would: the churn's cancelled rows stay in the due index as they come. The drain's
backlog is ANALYZEd where it is (its partition), not through the parent, as autovacuum does.

Checks: the measured tasks (missing, run twice, early) and the background: none of it may fall due
within the repeat (background_due) or land in DEFAULT (default_rows). The repeat ends with the
table emptied (TRUNCATE gives the disk back).
"""

import sys
import time
from datetime import timedelta

from timeouts.conf import get_settings
from timeouts.storage.partitions import bucket_start, maintain, partition_name

from . import machine, stats
from . import scale_load as background
from .database import reset
from .handlers import CHURN, NOOP, PROBE, SCALE
from .held_process import HeldProcess
from .pairs import median_ratio, ratios_of
from .processes import Processes, flush_broker
from .progress import note
from .workload import db_now, due_times, probe_path, schedule_bulk, schedule_single, wait_for_starts, warm_worker

SCENARIOS = ("scale",)
VARIANTS = ("empty", "empty_churn", "loaded", "loaded_churn")
LABELS = {"empty": "empty table", "empty_churn": "empty table, churn",
          "loaded": "with the background rows", "loaded_churn": "with the background rows, churn"}
MEASURED = ("p50_ms", "p99_ms", "max_ms", "missing", "duplicates", "early", "sched_per_s", "drain_per_s", "claim_per_s",
            "drain_missing", "drain_duplicates", "drain_early", "churn_per_s", "churn_cancel_per_s",
            "churn_cancel_missed", "churn_schedule_ms", "churn_cancel_ms", "background_due", "loadavg_1min",
            "cpu_steal_pct")
LOADED = ("rows", "load_s", "load_rows_per_s", "vacuum_s", "checkpoint_s", "partitions", "partitions_with_rows",
          "default_rows", "heap_mb", "indexes_mb", "total_mb", "bytes_per_row")
METRICS = {"scale": MEASURED}
HEADERS = {"scale": ["spread p50 ms", "p99 ms", "max ms", "missing", "dup", "early", "schedule()/s", "drain starts/s",
                     "claim+publish/s", "drain missing", "drain dup", "drain early", "churn schedule()/s",
                     "cancel()/s", "cancel found nothing", "churn schedule() ms", "cancel() ms", "background due",
                     "load 1 min", "steal %"]}
TITLES = {"scale": ("{n_spread:,} tasks due over {window:g} s (lateness, ms) and {n_drain:,} already due (drain), "
                    "dispatcher; background: {scale_rows:,} pending tasks due in the partitions ahead; churn: "
                    "{churn_rate:g} schedule()/s due {churn_ahead:g} s ahead, {churn_cancel:.0%} cancelled")}
# (scenario, title, headers, metrics): the background's own table (report.MORE_TABLES)
MORE_TABLES = (("scale", "scale: the background rows (set-based INSERT, VACUUM ANALYZE, CHECKPOINT; MB on disk)",
                ["rows", "load s", "rows/s", "vacuum s", "checkpoint s", "partitions", "with rows", "in DEFAULT",
                 "heap MB", "indexes MB", "total MB", "bytes/row"], LOADED),)
MEASURED_TYPES = (NOOP, PROBE)
READY_TIMEOUT = 120.0  # seconds for the churn writer to set up
BACKGROUND_DUE = "SELECT count(*) FROM timeouts_task WHERE biz_type = %s AND action_time <= clock_timestamp()"


def run(ctx, scenario, rep) -> dict:
    cfg = ctx.cfg
    first, second = ("empty", "empty_churn") if rep % 2 == 0 else ("empty_churn", "empty")
    reset(ctx.conn)
    flush_broker(cfg.broker_url)
    procs = Processes(env=ctx.env, cwd=ctx.cwd, log_dir=ctx.log_dir, label=f"scale/rep{rep + 1}")
    out = {}
    try:
        procs.worker(app=cfg.celery_app, concurrency=cfg.concurrency)
        warm_worker(ctx.app, ctx.conn, count=2 * cfg.concurrency, check=procs.check)
        for variant in (first, second):
            out[variant] = _phase(ctx, procs, variant, rep)
        loaded = _load(ctx)
        for variant in ("loaded", "loaded_churn") if first == "empty" else ("loaded_churn", "loaded"):
            out[variant] = _phase(ctx, procs, variant, rep)
            out[variant]["background_rows"] = loaded["rows"]
        out["loaded"].update(loaded)
    finally:
        procs.stop_all()
        reset(ctx.conn)  # the background's disk back at once
    return {variant: out[variant] for variant in VARIANTS if variant in out}


def _load(ctx) -> dict:
    cfg = ctx.cfg
    connect = ctx.db.connect
    report = maintain(using=ctx.alias)
    start, end = background.due_window(db_now(ctx.conn), cfg.scale_lead, background.partitions_end(report.partitions))
    note(f"scale: loading {cfg.scale_rows:,} background rows due {start:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M} UTC")
    out = background.load(connect, cfg.scale_rows, start, end, jobs=cfg.scale_jobs)
    note(f"scale: loaded in {out['load_s']:g} s; VACUUM ANALYZE")
    out.update(background.vacuum_analyze(connect, ctx.conn, jobs=cfg.scale_jobs))
    out.update(background.checkpoint(ctx.conn))
    out.update(background.sizes(ctx.conn))
    out["bytes_per_row"] = background.per_row_bytes(out["total_mb"], cfg.scale_rows)
    settings = get_settings()
    out.update(partition_interval=settings.PARTITION_INTERVAL, partitions_ahead=settings.PARTITIONS_AHEAD,
               first_due=start.isoformat(), last_due=end.isoformat())
    note(f"scale: {out['total_mb']:,} MB on disk, vacuumed in {out['vacuum_s']:g} s")
    return out


def _phase(ctx, procs, variant, rep) -> dict:
    """Spread then drain, with the churn running throughout if the variant says so."""
    cfg = ctx.cfg
    _clear(ctx)
    writer = None
    try:
        if variant.endswith("churn"):
            writer = _churn_writer(ctx)
            writer.wait_ready(READY_TIMEOUT, procs.check)
            writer.go()
            note(f"scale {variant}: churn of {cfg.churn_rate:g} tasks/s, {cfg.churn_ahead:g} s to steady")
            _sleep(cfg.churn_ahead, procs.check)
        load = machine.loadavg()[0]
        out = _spread(ctx, procs, variant, rep)
        _clear_measured(ctx)
        out.update(_drain(ctx, procs, variant))
        if writer is not None:
            writer.end_input()
            churn = writer.result(60.0, procs.check)
            out.update(churn_per_s=round(churn["scheduled"] / churn["seconds"], 1),
                       churn_cancel_per_s=round(churn["cancelled"] / churn["seconds"], 1),
                       churn_cancel_missed=churn["cancel_missed"], churn_schedule_ms=churn.get("schedule_ms"),
                       churn_cancel_ms=churn.get("cancel_ms"), churn=churn)
        out["background_due"] = ctx.conn.execute(BACKGROUND_DUE, (SCALE,)).fetchone()[0]
        out["loadavg_1min"] = load
        return out
    finally:
        if writer is not None:
            writer.stop()


def _spread(ctx, procs, variant, rep) -> dict:
    """scenarios.py's spread on the dispatcher: the path up and warm before the first task is scheduled."""
    cfg = ctx.cfg
    dispatcher = procs.dispatcher(cfg.dispatcher_args)
    try:
        probe_path(ctx.alias, ctx.conn, count=2, check=procs.check, timeout=60)
        base = db_now(ctx.conn) + timedelta(seconds=cfg.lead)
        times = due_times("spread", cfg.n_spread, base=base, window=cfg.window, seed=cfg.seed + rep)
        out = schedule_single(ctx.alias, times, label=f"scale {variant}: schedule()")
        wait = max(times).timestamp() - time.time() + cfg.wait_tail + cfg.n_spread / 100.0
        wait_for_starts(ctx.conn, cfg.n_spread, deadline=time.monotonic() + wait, check=procs.check,
                        label=f"scale {variant}: spread started")
    finally:
        procs.stop(dispatcher)
    out.update(stats.timeouts_run(ctx.conn))
    out.pop("first_start", None)
    out.pop("last_start", None)
    return out


def _drain(ctx, procs, variant) -> dict:
    """scenarios.py's drain on the dispatcher: the backlog in place (and ANALYZEd) when it starts."""
    cfg = ctx.cfg
    times = due_times("drain", cfg.n_drain, base=db_now(ctx.conn) - timedelta(seconds=1))
    schedule_bulk(ctx.alias, times, chunk=cfg.bulk_chunk)
    ctx.conn.execute(f'ANALYZE "{_partition_of(times[0])}"')
    dispatcher = procs.dispatcher(cfg.dispatcher_args)
    try:
        wait_for_starts(ctx.conn, cfg.n_drain, deadline=time.monotonic() + cfg.drain_timeout, check=procs.check,
                        label=f"scale {variant}: drain started")
    finally:
        procs.stop(dispatcher)
    drained = stats.timeouts_run(ctx.conn)
    return {"drain_per_s": drained["start_per_s"], "drain_missing": drained["missing"],
            "drain_duplicates": drained["duplicates"], "drain_early": drained["early"],
            "claim_per_s": stats.claim_rate(ctx.conn)["claim_per_s"]}


def _partition_of(moment) -> str:
    return partition_name(bucket_start(moment, get_settings().PARTITION_INTERVAL), get_settings().PARTITION_INTERVAL)


def _clear_measured(ctx):
    ctx.conn.execute("DELETE FROM timeouts_task WHERE biz_type = ANY(%s)", (list(MEASURED_TYPES),))
    ctx.conn.execute("TRUNCATE timeouts_bench_start")


def _clear(ctx):
    """Before a phase: no task of an earlier phase (measured or churned) left; the current partition
    vacuumed and analyzed."""
    ctx.conn.execute("DELETE FROM timeouts_task WHERE biz_type = ANY(%s)", ([*MEASURED_TYPES, CHURN],))
    ctx.conn.execute("TRUNCATE timeouts_bench_start")
    ctx.conn.execute(f'VACUUM (ANALYZE) "{_partition_of(db_now(ctx.conn))}"')


def _churn_writer(ctx) -> HeldProcess:
    cfg = ctx.cfg
    args = [sys.executable, "-m", "benchmarks.churn_writer", "--rate", str(cfg.churn_rate), "--ahead",
            str(cfg.churn_ahead), "--cancel-share", str(cfg.churn_cancel)]
    return HeldProcess(args, env=ctx.env, cwd=ctx.cwd, name="churn writer", log=ctx.log_dir / "churn_writer.log")


def _sleep(seconds, check):
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        check()
        time.sleep(min(0.5, max(0.0, until - time.monotonic())))


# --- ratios and targets ------------------------------------------------------------------------------

PAIRS = (("loaded", "empty"), ("loaded_churn", "empty_churn"), ("loaded_churn", "empty"), ("empty_churn", "empty"))
RATIO_METRICS = ("p99_ms", "drain_per_s", "claim_per_s")
FLAT = 0.10  # "flat": within this share of the empty table


def ratios(runs) -> dict:
    """Per repeat: with the background against the empty table (each without churn and with it), and
    the churn's own cost on each."""
    return ratios_of(runs, [("scale", a, b, metric) for a, b in PAIRS for metric in RATIO_METRICS])


def targets(summary, ratio_table) -> list:
    def ratio(pair, metric):
        return median_ratio(ratio_table, "scale", pair, metric)

    def worst(metrics):
        values = [summary.get("scale", {}).get(v, {}).get(m) for v in VARIANTS for m in metrics]
        return None if any(v is None for v in values) else sum(v["max"] for v in values)

    rows = []
    for pair, what in (("loaded/empty", ""), ("loaded_churn/empty_churn", ", under the churn")):
        rows += [
            ("scale", f"scale{what}: spread p99 with the background rows / empty table <= {1 + FLAT:g}",
             ratio(pair, "p99_ms"), lambda v: v <= 1 + FLAT),
            ("scale", f"scale{what}: drain starts/s with the background rows / empty table >= {1 - FLAT:g}",
             ratio(pair, "drain_per_s"), lambda v: v >= 1 - FLAT),
        ]
    rows.append(("scale", "scale: missing + duplicates + early = 0, spread and drain; no background row due "
                 "(every run, every variant)",
                 worst(("missing", "duplicates", "early", "drain_missing", "drain_duplicates", "drain_early",
                        "background_due")), lambda v: v == 0))
    return rows
