"""One run of spread, burst, drain or publish on one path, from an empty table to its numbers.

`publish` is drain without a worker: how fast the path alone claims and publishes (up to
MAX_DISPATCHED tasks, where backpressure stops it), with nothing else competing for the cores.

Paths: `scan` (the beat-equivalent scan loop alone), `dispatcher` (the dispatcher command alone),
`celery` (the same no-op body published straight to Celery: eta= for spread/burst, due for drain).
Every run (but publish) starts a fresh worker and warms it; all its processes stop in `finally`.
"""

import time
from datetime import timedelta

from timeouts.states import Status

from . import stats
from .database import reset
from .handlers import NOOP
from .processes import Processes, flush_broker
from .workload import (
    db_now,
    due_times,
    probe_path,
    publish_direct,
    schedule_bulk,
    schedule_single,
    wait_for_starts,
    wait_until,
    warm_worker,
)


def run(ctx, scenario, path, rep) -> dict:
    cfg = ctx.cfg
    reset(ctx.conn)
    flush_broker(cfg.broker_url)
    procs = Processes(env=ctx.env, cwd=ctx.cwd, log_dir=ctx.log_dir, label=f"{scenario}/{path}/rep{rep + 1}")
    try:
        if scenario == "publish":
            return _publish(ctx, procs, path)
        procs.worker(app=cfg.celery_app, concurrency=cfg.concurrency)
        warm_worker(ctx.app, ctx.conn, count=2 * cfg.concurrency, check=procs.check)
        if scenario == "drain":
            out = _drain(ctx, procs, path)
        else:
            out = _timed(ctx, procs, scenario, path, rep)
    finally:
        procs.stop_all()
    out.pop("first_start", None)
    out.pop("last_start", None)
    return out


def _start_path(ctx, procs, path):
    if path == "dispatcher":
        return procs.dispatcher(ctx.cfg.dispatcher_args)
    return procs.scan_loop(interval=ctx.cfg.scan_interval)


def _timed(ctx, procs, scenario, path, rep) -> dict:
    """spread / burst: the path is up and warm before the first task is scheduled."""
    cfg = ctx.cfg
    n = cfg.n_spread if scenario == "spread" else cfg.n_burst
    if path != "celery":
        _start_path(ctx, procs, path)
        probe_path(ctx.alias, ctx.conn, count=2, check=procs.check, timeout=cfg.scan_interval + 60)
    base = db_now(ctx.conn) + timedelta(seconds=cfg.lead)
    times = due_times(scenario, n, base=base, window=cfg.window, seed=cfg.seed + rep)
    if path == "celery":
        out = publish_direct(ctx.app, times, eta=True, label=f"{scenario}: apply_async(eta=)")
    else:
        out = schedule_single(ctx.alias, times, label=f"{scenario}: schedule()")
    slack = cfg.scan_interval if path == "scan" else 0.0
    wait = max(times).timestamp() - time.time() + slack + cfg.wait_tail + n / 100.0
    wait_for_starts(ctx.conn, n, deadline=time.monotonic() + wait, check=procs.check,
                    label=f"{scenario} {path}: started")
    if path == "celery":
        out.update(stats.analyze(dict(enumerate(times)), stats.direct_starts(ctx.conn)))
    else:
        out.update(stats.timeouts_run(ctx.conn))
    return out


def _drain(ctx, procs, path) -> dict:
    """drain: the backlog is in place (and ANALYZEd) when the dispatcher or scan loop starts; for
    Celery direct, the messages are published to the running worker as fast as one producer can."""
    cfg = ctx.cfg
    times = due_times("drain", cfg.n_drain, base=db_now(ctx.conn) - timedelta(seconds=1))
    out = {}
    if path != "celery":
        out.update(schedule_bulk(ctx.alias, times, chunk=cfg.bulk_chunk))
        ctx.conn.execute("ANALYZE timeouts_task")
    started = time.time()
    if path == "celery":
        out.update(publish_direct(ctx.app, times, eta=False, label="drain: apply_async()"))
    else:
        _start_path(ctx, procs, path)
    wait_for_starts(ctx.conn, cfg.n_drain, deadline=time.monotonic() + cfg.drain_timeout, check=procs.check,
                    label=f"drain {path}: started")
    if path == "celery":
        out.update(stats.analyze(dict(enumerate(times)), stats.direct_starts(ctx.conn)))
        out["claim_per_s"] = out["sched_per_s"]  # what reached the broker per second
    else:
        out.update(stats.timeouts_run(ctx.conn))
        out.update(stats.claim_rate(ctx.conn))
    if out.get("last_start"):
        out["drain_total_s"] = round(out["last_start"].timestamp() - started, 2)
    out["drain_per_s"] = out.get("start_per_s")
    return out


def _publish(ctx, procs, path) -> dict:
    """publish: the drain backlog, no worker. The rate comes from the claim batches, as in drain;
    Celery direct publishes the same number of messages."""
    cfg = ctx.cfg
    times = due_times("drain", cfg.n_drain, base=db_now(ctx.conn) - timedelta(seconds=1))
    if path == "celery":
        out = publish_direct(ctx.app, times, eta=False, label="publish: apply_async()")
        return {"n": cfg.n_drain, "claimed": cfg.n_drain, **out, "claim_per_s": out["sched_per_s"]}
    out = schedule_bulk(ctx.alias, times, chunk=cfg.bulk_chunk)
    ctx.conn.execute("ANALYZE timeouts_task")
    # Without workers, backpressure would stop the claimer at MAX_DISPATCHED: lift it, so this
    # measures the path's own claim+publish rate over the whole backlog.
    target = cfg.n_drain
    procs.env["TIMEOUTS_MAX_DISPATCHED"] = str(cfg.n_drain + 1)
    try:
        _start_path(ctx, procs, path)
    finally:
        procs.env.pop("TIMEOUTS_MAX_DISPATCHED", None)

    def claimed():
        return ctx.conn.execute("SELECT count(*) FROM timeouts_task WHERE biz_type = %s AND status = %s",
                                (NOOP, Status.DISPATCHED)).fetchone()[0]

    try:
        wait_until(lambda: claimed() >= target, cfg.drain_timeout, procs.check, f"{target} claims")
    except TimeoutError as exc:
        out["error"] = str(exc)
    out.update(n=cfg.n_drain, claimed=claimed(), **stats.claim_rate(ctx.conn))
    return out
