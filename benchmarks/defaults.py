"""The `defaults` scenario: a new host project against a tuned one, side by side in one repeat.

Workload: N_SPREAD tasks spread over the window plus N_BURST due at one instant in its middle, one
prefork worker (`concurrency` processes) and one dispatcher. It runs twice: with the settings of the
bench (the demo project: CONN_MAX_AGE, CELERY_DB_REUSE_MAX, prepared statements) and with
`benchmarks.settings_defaults` (Django's and Celery's defaults). The spread's lateness is taken over
the tasks due outside the burst (before it, or more than BURST_SHADOW seconds after it), the
burst's as the lateness of its last start.
"""

import time
from datetime import timedelta

from . import stats
from .database import reset
from .handlers import NOOP
from .processes import Processes, flush_broker
from .workload import db_now, due_times, probe_path, schedule_single, wait_for_starts, warm_worker

N_SPREAD = 1000
N_BURST = 300
BURST_SHADOW = 1.0  # seconds after the burst during which spread tasks wait behind it
VARIANTS = {"tuned": None, "defaults": "benchmarks.settings_defaults"}  # None: the bench's own settings

STARTS = """
SELECT t.action_time, s.started_at
FROM timeouts_task AS t JOIN timeouts_bench_start AS s ON s.job_id = t.job_id
WHERE t.biz_type = %s
"""


def run(ctx, rep) -> dict:
    """{variant: numbers} for both variants, in an order that alternates with the repeat."""
    order = list(VARIANTS) if rep % 2 == 0 else list(reversed(VARIANTS))
    return {variant: _one(ctx, variant, rep) for variant in order}


def _one(ctx, variant, rep) -> dict:
    cfg = ctx.cfg
    reset(ctx.conn)
    flush_broker(cfg.broker_url)
    env = dict(ctx.env)
    if VARIANTS[variant]:
        env["DJANGO_SETTINGS_MODULE"] = VARIANTS[variant]
    procs = Processes(env=env, cwd=ctx.cwd, log_dir=ctx.log_dir, label=f"defaults/{variant}/rep{rep + 1}")
    try:
        procs.worker(app=cfg.celery_app, concurrency=cfg.concurrency)
        warm_worker(ctx.app, ctx.conn, count=2 * cfg.concurrency, check=procs.check)
        procs.dispatcher(cfg.dispatcher_args)
        probe_path(ctx.alias, ctx.conn, count=2 * cfg.concurrency, check=procs.check, timeout=60)
        base = db_now(ctx.conn) + timedelta(seconds=cfg.lead)
        burst_at = base + timedelta(seconds=cfg.window / 2)
        times = due_times("spread", N_SPREAD, base=base, window=cfg.window, seed=cfg.seed + rep)
        times += [burst_at] * N_BURST
        times.sort()  # as a host schedules: in time order, each call well before its task is due
        out = schedule_single(ctx.alias, times, label=f"defaults/{variant}: schedule()")
        wait = max(times).timestamp() - time.time() + cfg.wait_tail
        wait_for_starts(ctx.conn, len(times), deadline=time.monotonic() + wait, check=procs.check,
                        label=f"defaults/{variant}: started")
    finally:
        procs.stop_all()
    out.update(_lateness(ctx.conn, burst_at))
    out.update({k: v for k, v in stats.timeouts_run(ctx.conn).items()
                if k in ("n", "started", "missing", "duplicates", "early")})
    return out


def _lateness(conn, burst_at) -> dict:
    spread, burst = [], []
    shadow_end = burst_at + timedelta(seconds=BURST_SHADOW)
    for action_time, started_at in conn.execute(STARTS, (NOOP,)):
        late = (started_at - action_time).total_seconds() * 1000.0
        if action_time == burst_at:
            burst.append(late)
        elif not burst_at <= action_time < shadow_end:
            spread.append(late)
    spread.sort()
    return {"p50_ms": stats.rnd(stats.pct(spread, 50)), "p99_ms": stats.rnd(stats.pct(spread, 99)),
            "spread_counted": len(spread), "burst_last_ms": stats.rnd(max(burst) if burst else None)}
