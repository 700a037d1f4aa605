"""shards_drain and shards_outage: tasks over several shards, served by one dispatcher process (a
thread per shard) and one worker.

- shards_drain: N tasks due at one instant, spread over k shards by their keys' hash, k in
  COUNTS, on one server and on separate clusters. Twice per k: with no worker (claim+publish/s,
  as `publish`: backpressure lifted) and with one (handler starts/s, as `drain`). The dispatcher
  is up and listening before the backlog is written, and the backlog falls due `lead` seconds
  later: the CPU time is counted from then (the processes' start-up is not the work measured) to
  the last claim or start, for the dispatcher, the worker and the PostgreSQL backends serving them.
- shards_outage: N tasks spread over the window on three clusters, all up, then with one cluster
  stopped once they are scheduled, before the first falls due: the lateness of the tasks of the
  two that stay up (the same tasks, and the same work for them, in both variants).
"""

import subprocess
import time
from datetime import timedelta

import psycopg
from django.db import DatabaseError

from timeouts.states import Status
from timeouts.storage import shards

from . import stats
from .database import BenchError
from .handlers import NOOP, PROBE
from .processes import Processes, flush_broker
from .progress import Progress, note
from .shard_servers import CpuMeter, ShardSet, sampling, tree
from .workload import db_now, due_times, wait_until, warm_worker

COUNTS = (1, 2, 4)
OUTAGE_SHARDS = 3
# The shard whose cluster shards_outage stops: never the first, where the handlers record starts.
STOPPED = 2
POLL = 0.5  # seconds between the bench's counts: the measured processes share the cores
ERRORS = (BenchError, TimeoutError, OSError, RuntimeError, ValueError, subprocess.SubprocessError, psycopg.Error,
          DatabaseError)

STARTS = "SELECT job_id, started_at FROM timeouts_bench_start WHERE job_id >= 0"
EXPECTED = "SELECT job_id, action_time FROM timeouts_task WHERE biz_type = %s"


def shard_of(key, k) -> int:
    """The shard (index) of a task key among k shards, as the host's processes route it."""
    return shards.shard_index(shards.slot_of(str(key)), k)


def keys_on(i, k, count, prefix) -> list[str]:
    """`count` keys that hash to shard i of k."""
    keys, n = [], 0
    while len(keys) < count:
        if shard_of(f"{prefix}{n}", k) == i:
            keys.append(f"{prefix}{n}")
        n += 1
    return keys


def on_shard(shard_set, i):
    """The API on shard i: the bench process has one shard of its own, so `db_manager(alias)` puts a
    task there in its key's slot, the slot by which the child processes find it."""
    from timeouts.models import TimeoutTask

    if len(shards.aliases()) != 1:
        raise BenchError("the bench process must run with one shard (TIMEOUTS_SHARD_URLS unset)")
    return TimeoutTask.objects.db_manager(shard_set.alias(i))


def guarded(label, fn, *args) -> dict:
    """One variant: a failure is recorded in its result, and the other variants go on."""
    try:
        return fn(*args)
    except ERRORS as exc:
        note(f"{label} failed: {exc.__class__.__name__}: {exc}")
        return {"error": f"{exc.__class__.__name__}: {exc}"}


# --- shards_drain --------------------------------------------------------------------------------

def drain(ctx, rep) -> dict:
    out = {}
    wheres = ("server", "clusters") if rep % 2 == 0 else ("clusters", "server")
    counts = COUNTS if rep % 2 == 0 else tuple(reversed(COUNTS))
    for where in wheres:
        try:
            with ShardSet(ctx, max(COUNTS), where) as shard_set:
                for k in counts:
                    label = f"shards_drain/{where}_{k}/rep{rep + 1}"
                    result = guarded(label, _publish, ctx, shard_set, k, label)
                    if "error" not in result:
                        result.update(guarded(label, _drain, ctx, shard_set, k, label))
                    out[f"{where}_{k}"] = result
        except ERRORS as exc:  # creating or dropping the shards
            note(f"shards_drain on {where}: {exc.__class__.__name__}: {exc}")
            for k in counts:
                out.setdefault(f"{where}_{k}", {"error": f"{exc.__class__.__name__}: {exc}"})
    return out


def _listening(shard_set, k, procs):
    wait_until(lambda: shard_set.listening(k), 60, procs.check, "the dispatcher to listen on every shard")


def _backlog(ctx, shard_set, k, n):
    """n tasks due `lead` seconds from now, each on its key's shard, ANALYZEd; returns the due time."""
    cfg = ctx.cfg
    due = db_now(shard_set.conns[0]) + timedelta(seconds=cfg.lead)
    by_shard = {}
    for key in range(n):
        by_shard.setdefault(shard_of(key, k), []).append(str(key))
    for i, keys in sorted(by_shard.items()):
        manager = on_shard(shard_set, i)
        for first in range(0, len(keys), cfg.bulk_chunk):
            manager.bulk_schedule([{"biz_type": NOOP, "biz_id": key, "at": due, "on_conflict": None}
                                   for key in keys[first:first + cfg.bulk_chunk]])
        shard_set.conns[i].execute("ANALYZE timeouts_task")
    return due


def _measure_from(meter, due):
    meter.start()
    if time.time() > due.timestamp() - 0.2:
        raise BenchError("writing the backlog took longer than --lead: raise it")


def _count(shard_set, k, status) -> int:
    query = "SELECT count(*) FROM timeouts_task WHERE biz_type = %s AND status = %s"
    return sum(conn.execute(query, (NOOP, status)).fetchone()[0] for conn in shard_set.conns[:k])


def claim_rate(batches_by_shard) -> int | None:
    """Claimed and published per second over all shards: the tasks over the time from the first
    claim to the end of the last. A claim's batch is published before the next claim of its shard,
    so a shard's last batch is taken to end one mean interval between its claims after it."""
    firsts, ends, n = [], [], 0
    for batches in batches_by_shard:
        if len(batches) < 2:
            return None
        first, last = batches[0][0], batches[-1][0]
        firsts.append(first)
        ends.append(last + (last - first) / (len(batches) - 1))
        n += sum(count for _, count in batches)
    span = (max(ends) - min(firsts)).total_seconds()
    return round(n / span) if span > 0 else None


def _publish(ctx, shard_set, k, label) -> dict:
    """No worker, backpressure lifted: the dispatcher's own claim+publish rate over k shards."""
    cfg = ctx.cfg
    n = cfg.n_shards_drain
    shard_set.reset(k)
    flush_broker(cfg.broker_url)
    env = shard_set.env(k, TIMEOUTS_MAX_DISPATCHED=n + 1)
    procs = Processes(env=env, cwd=ctx.cwd, log_dir=ctx.log_dir, label=f"{label}/publish")
    try:
        dispatcher = procs.dispatcher(cfg.dispatcher_args)
        _listening(shard_set, k, procs)
        meter = CpuMeter({"dispatcher": lambda: tree(dispatcher), "postgres": lambda: shard_set.backend_pids(k)})
        due = _backlog(ctx, shard_set, k, n)
        _measure_from(meter, due)
        wait_until(lambda: _count(shard_set, k, Status.DISPATCHED) >= n, cfg.drain_timeout,
                   sampling(procs.check, meter), f"{n} claims over {k} shard(s)", interval=POLL)
        cpu = meter.stop()
    finally:
        procs.stop_all()
    batches = [conn.execute(stats.CLAIM_BATCHES, (NOOP,)).fetchall() for conn in shard_set.conns[:k]]
    total = sum(cpu.values())
    return {"n": n, "shards": k, "claimed": _count(shard_set, k, Status.DISPATCHED), "claim_per_s": claim_rate(batches),
            "publish_cpu_s": round(total, 2), "publish_dispatcher_cpu_s": cpu["dispatcher"],
            "publish_postgres_cpu_s": cpu["postgres"], "publish_per_cpu_s": round(n / total) if total else None}


def _probe(shard_set, k, procs, count=2):
    """`count` tasks due now on each shard, through the dispatcher and the worker: every thread and
    every connection of the chain is up before measuring."""
    now = db_now(shard_set.conns[0])
    for i in range(k):
        for key in keys_on(i, k, count, "probe-"):
            on_shard(shard_set, i).schedule(PROBE, biz_id=key, at=now, on_conflict=None)
    done = "SELECT count(*) FROM timeouts_task WHERE biz_type = %s AND status = %s"
    wait_until(lambda: all(conn.execute(done, (PROBE, Status.DONE)).fetchone()[0] >= count
                           for conn in shard_set.conns[:k]), 60, procs.check, "the probe tasks on every shard")


def serve(ctx, shard_set, k, procs, *, scan=False):
    """A worker, a dispatcher over the first k shards and, if `scan`, the scan loop, all warmed up."""
    cfg = ctx.cfg
    procs.worker(app=cfg.celery_app, concurrency=cfg.concurrency)
    warm_worker(ctx.app, shard_set.conns[0], count=2 * cfg.concurrency, check=procs.check)
    procs.dispatcher(cfg.dispatcher_args)
    if scan:
        procs.scan_loop(interval=cfg.scan_interval)
    _listening(shard_set, k, procs)
    _probe(shard_set, k, procs)


def _started(conn) -> int:
    return conn.execute("SELECT count(DISTINCT job_id) FROM timeouts_bench_start WHERE job_id >= 0").fetchone()[0]


def _lateness(shard_set, indexes):
    """stats.analyze() of the bench tasks of the shards `indexes` (their starts are all recorded on
    the first shard)."""
    expected = {}
    for i in indexes:
        expected.update(shard_set.conns[i].execute(EXPECTED, (NOOP,)).fetchall())
    out = stats.analyze(expected, shard_set.conns[0].execute(STARTS).fetchall())
    out.pop("unexpected", None)  # the starts of the other shards' tasks
    return out


def _drain(ctx, shard_set, k, label) -> dict:
    """One worker: handler starts per second over k shards, and what they cost."""
    cfg = ctx.cfg
    n = cfg.n_shards_drain
    shard_set.reset(k)
    flush_broker(cfg.broker_url)
    procs = Processes(env=shard_set.env(k), cwd=ctx.cwd, log_dir=ctx.log_dir, label=f"{label}/drain")
    try:
        worker = procs.worker(app=cfg.celery_app, concurrency=cfg.concurrency)
        warm_worker(ctx.app, shard_set.conns[0], count=2 * cfg.concurrency, check=procs.check)
        dispatcher = procs.dispatcher(cfg.dispatcher_args)
        _listening(shard_set, k, procs)
        _probe(shard_set, k, procs)
        meter = CpuMeter({"dispatcher": lambda: tree(dispatcher), "worker": lambda: tree(worker),
                          "postgres": lambda: shard_set.backend_pids(k)})
        due = _backlog(ctx, shard_set, k, n)
        _measure_from(meter, due)
        progress = Progress(f"{label}: started", n)

        def all_started():
            count = _started(shard_set.conns[0])
            progress.update(count)
            return count >= n

        wait_until(all_started, cfg.drain_timeout, sampling(procs.check, meter), f"{n} starts", interval=POLL)
        progress.finish(n)
        cpu = meter.stop()
        time.sleep(1.0)  # a second start of a task has time to show
    finally:
        procs.stop_all()
    out = _lateness(shard_set, range(k))
    total = sum(cpu.values())
    wall = (out["last_start"] - due).total_seconds() if out.get("last_start") else None
    return {"start_per_s": out["start_per_s"], "started": out["started"], "missing": out["missing"],
            "duplicates": out["duplicates"], "early": out["early"], "drain_cpu_s": round(total, 2),
            "drain_dispatcher_cpu_s": cpu["dispatcher"], "drain_worker_cpu_s": cpu["worker"],
            "drain_postgres_cpu_s": cpu["postgres"], "drain_per_cpu_s": round(n / total) if total else None,
            "drain_cpu_pct": round(100.0 * total / wall) if wall else None}


# --- shards_outage -------------------------------------------------------------------------------

def outage(ctx, rep) -> dict:
    variants = ("all_up", "one_stopped") if rep % 2 == 0 else ("one_stopped", "all_up")
    with ShardSet(ctx, OUTAGE_SHARDS, "clusters") as shard_set:
        return {variant: guarded(f"shards_outage/{variant}/rep{rep + 1}", _outage_one, ctx, shard_set, variant, rep)
                for variant in variants}


def _outage_one(ctx, shard_set, variant, rep) -> dict:
    cfg = ctx.cfg
    k, n, stopped = OUTAGE_SHARDS, cfg.n_shards_outage, variant == "one_stopped"
    shard_set.reset(k)
    flush_broker(cfg.broker_url)
    procs = Processes(env=shard_set.env(k), cwd=ctx.cwd, log_dir=ctx.log_dir,
                      label=f"shards_outage/{variant}/rep{rep + 1}")
    try:
        serve(ctx, shard_set, k, procs)
        base = db_now(shard_set.conns[0]) + timedelta(seconds=cfg.lead)
        times = due_times("spread", n, base=base, window=cfg.window, seed=cfg.seed + rep)
        for key, at in enumerate(times):
            on_shard(shard_set, shard_of(key, k)).schedule(NOOP, biz_id=str(key), at=at, on_conflict=None)
        if stopped:
            shard_set.stop(STOPPED)
        if time.time() > base.timestamp():
            raise BenchError("scheduling the spread (and stopping a cluster) took longer than --lead: raise it")
        live = sum(1 for key in range(n) if shard_of(key, k) != STOPPED)
        expected = live if stopped else n
        wait = max(times).timestamp() - time.time() + cfg.wait_tail + n / 100.0
        wait_until(lambda: _started(shard_set.conns[0]) >= expected, wait, procs.check,
                   f"the {expected} tasks of the shards that are up", interval=POLL)
        time.sleep(1.0)
    finally:
        procs.stop_all()
        if stopped:
            shard_set.start(STOPPED)
    out = {key: value for key, value in _lateness(shard_set, [i for i in range(k) if i != STOPPED]).items()
           if key not in ("first_start", "last_start", "start_per_s")}
    out["not_counted"] = n - live  # the stopped cluster's share, in both variants
    if not stopped:
        out["all_p99_ms"] = _lateness(shard_set, range(k))["p99_ms"]
    return out
