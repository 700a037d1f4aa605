"""tracing: what tracing with OpenTelemetry costs, on against off, on the same workload.

Each variant runs, on one worker (`concurrency` processes) and the dispatcher, each with fresh
processes:

- spread: N_SPREAD tasks due over the window, scheduled one by one by the bench (lateness);
- drain: N_DRAIN tasks already due when the dispatcher starts (handler starts per second: each
  task claimed, published and run).

`off` is the bench's own settings: opentelemetry-api installed, no tracer provider, nothing
scheduled in a span. `on` runs the worker and the dispatcher with `benchmarks.settings_tracing`
(a TracerProvider with a BatchSpanProcessor and an exporter that drops the spans, span_sink.py), and
the bench makes each schedule() call (each bulk_schedule() call of the drain) in a span of its own,
as an instrumented request would: every task stores its trace context, its run is a span linked to
it, and so is the dispatch span of the batch that published it.
"""

import tempfile
import time
from contextlib import nullcontext
from datetime import timedelta

from . import machine, stats
from .database import reset
from .pairs import median_ratio, ratios_of
from .processes import Processes, flush_broker
from .workload import db_now, due_times, probe_path, schedule_bulk, schedule_single, wait_for_starts, warm_worker

SCENARIOS = ("tracing",)
VARIANTS = ("off", "on")
SETTINGS = "benchmarks.settings_tracing"  # the worker's and the dispatcher's, tracing on
LABELS = {"off": "tracing off (no tracer provider)",
          "on": "tracing on (SDK, BatchSpanProcessor, exporter that drops)"}
METRICS = {"tracing": ("p50_ms", "p90_ms", "p99_ms", "max_ms", "missing", "duplicates", "early", "sched_per_s",
                       "drain_per_s", "claim_per_s", "drain_missing", "drain_duplicates", "drain_early", "traced",
                       "spans", "loadavg_1min", "cpu_steal_pct")}
HEADERS = {"tracing": ["spread p50 ms", "p90 ms", "p99 ms", "max ms", "missing", "dup", "early", "schedule()/s",
                       "drain starts/s", "claim+publish/s", "drain missing", "drain dup", "drain early",
                       "contexts stored", "spans exported", "load 1 min", "steal %"]}
TITLES = {"tracing": ("{n_spread:,} tasks due over {window:.0f} s, each scheduled in a span of its own (on), then "
                      "{n_drain:,} already due, with OpenTelemetry's SDK in every process against none")}

TRACED = "SELECT count(*) FROM timeouts_task WHERE trace_context IS NOT NULL"


def run(ctx, scenario, rep) -> dict:
    order = VARIANTS if rep % 2 == 0 else tuple(reversed(VARIANTS))
    return {variant: _one(ctx, variant, rep) for variant in order}


def _one(ctx, variant, rep) -> dict:
    load = machine.loadavg()[0]
    with tempfile.TemporaryDirectory(prefix="timeouts-bench-spans-") as folder:
        env, provider, within = dict(ctx.env), None, nullcontext
        if variant == "on":
            from . import span_sink

            env.update({"DJANGO_SETTINGS_MODULE": SETTINGS, span_sink.SPANS_DIR: folder})
            provider = span_sink.tracer_provider("bench", folder)
            tracer = provider.get_tracer("benchmarks")

            def within():
                return tracer.start_as_current_span("schedule")
        try:
            out = _spread(ctx, env, variant, rep, within)
            out.update(_drain(ctx, env, variant, rep, within))
        finally:
            if provider is not None:
                provider.shutdown()
        if provider is not None:
            out["spans"] = span_sink.exported(folder)
    out["traced"] = out.pop("spread_traced") + out.pop("drain_traced")
    return {**out, "loadavg_1min": load}


def _processes(ctx, env, label):
    cfg = ctx.cfg
    reset(ctx.conn)
    flush_broker(cfg.broker_url)
    procs = Processes(env=env, cwd=ctx.cwd, log_dir=ctx.log_dir, label=label)
    procs.worker(app=cfg.celery_app, concurrency=cfg.concurrency)
    warm_worker(ctx.app, ctx.conn, count=2 * cfg.concurrency, check=procs.check)
    return procs


def _spread(ctx, env, variant, rep, within) -> dict:
    """The path up and warm, then each task scheduled `lead` seconds or more ahead (scenarios.py's spread)."""
    cfg = ctx.cfg
    procs = _processes(ctx, env, f"tracing/{variant}/spread/rep{rep + 1}")
    try:
        procs.dispatcher(cfg.dispatcher_args)
        probe_path(ctx.alias, ctx.conn, count=2, check=procs.check, timeout=60)
        base = db_now(ctx.conn) + timedelta(seconds=cfg.lead)
        times = due_times("spread", cfg.n_spread, base=base, window=cfg.window, seed=cfg.seed + rep)
        out = schedule_single(ctx.alias, times, label=f"tracing {variant}: schedule()", within=within)
        wait = max(times).timestamp() - time.time() + cfg.wait_tail + cfg.n_spread / 100.0
        wait_for_starts(ctx.conn, cfg.n_spread, deadline=time.monotonic() + wait, check=procs.check,
                        label=f"tracing {variant}: spread started")
    finally:
        procs.stop_all()
    out.update(_clean(stats.timeouts_run(ctx.conn)))
    out["spread_traced"] = ctx.conn.execute(TRACED).fetchone()[0]
    return out


def _drain(ctx, env, variant, rep, within) -> dict:
    """The backlog in place (and ANALYZEd) when the dispatcher starts (scenarios.py's drain)."""
    cfg = ctx.cfg
    procs = _processes(ctx, env, f"tracing/{variant}/drain/rep{rep + 1}")
    try:
        times = due_times("drain", cfg.n_drain, base=db_now(ctx.conn) - timedelta(seconds=1))
        schedule_bulk(ctx.alias, times, chunk=cfg.bulk_chunk, within=within)
        ctx.conn.execute("ANALYZE timeouts_task")
        procs.dispatcher(cfg.dispatcher_args)
        wait_for_starts(ctx.conn, cfg.n_drain, deadline=time.monotonic() + cfg.drain_timeout, check=procs.check,
                        label=f"tracing {variant}: drain started")
    finally:
        procs.stop_all()
    drained = stats.timeouts_run(ctx.conn)
    return {"drain_per_s": drained["start_per_s"], "drain_missing": drained["missing"],
            "drain_duplicates": drained["duplicates"], "drain_early": drained["early"],
            "claim_per_s": stats.claim_rate(ctx.conn)["claim_per_s"],
            "drain_traced": ctx.conn.execute(TRACED).fetchone()[0]}


def _clean(out) -> dict:
    out.pop("first_start", None)
    out.pop("last_start", None)
    return out


def ratios(runs) -> dict:
    """Per repeat: tracing on against off."""
    return ratios_of(runs, [("tracing", "on", "off", metric)
                            for metric in ("p50_ms", "p99_ms", "drain_per_s", "claim_per_s", "sched_per_s")])


def targets(summary, ratio_table) -> list:
    def ratio(metric):
        return median_ratio(ratio_table, "tracing", "on/off", metric)

    def worst(metrics):
        values = [summary.get("tracing", {}).get(v, {}).get(m) for v in VARIANTS for m in metrics]
        return None if any(v is None for v in values) else sum(v["max"] for v in values)

    return [
        ("tracing", "tracing: spread lateness p99, on / off <= 1.05", ratio("p99_ms"), lambda v: v <= 1.05),
        ("tracing", "tracing: drain starts/s, on / off >= 0.95", ratio("drain_per_s"), lambda v: v >= 0.95),
        ("tracing", "tracing: missing + duplicates + early = 0, spread and drain (every run, both variants)",
         worst(("missing", "duplicates", "early", "drain_missing", "drain_duplicates", "drain_early")),
         lambda v: v == 0),
    ]
