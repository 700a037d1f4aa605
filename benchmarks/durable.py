"""DurableTask against Celery's own ETA: the same body (`benchmarks.handlers.durable` and `.direct`),
the same calls (`apply_async(eta=)` / `countdown=`), the same worker command, side by side in
each repeat, the order alternating with the repeat.

- durable_spread: N calls due uniformly over the window; lateness of the body's start.
- durable_memory: N calls due in an hour; the worker's RSS (main process and pool processes)
  once it holds what it will hold, against an idle worker.
- durable_restart: N calls due 30-60 s ahead; at 40 s every worker process is killed -9, and a
  new worker starts 5 s later. Calls not started (and of them, those still waiting to run),
  duplicated and late calls; the outage lasts from the kill to the new worker's first start.
- durable_cost: N `apply_async(countdown=3600)` calls per second, with no worker.
- durable_cpu: N calls falling due at a steady rate, against N plain Celery messages of the same
  body: the CPU time per call of each process that serves them (durable_cpu.py).

DurableTask needs its dispatcher (and, to find the calls of a worker that died, the scan: beat's
`timeouts.scan`, here the bench's scan loop); Celery's ETA needs the worker alone.
"""

import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime

from timeouts.durable.calls import biz_type_for

from . import stats
from .database import BenchError, reset
from .durable_cpu import measure as _cpu
from .handlers import DIRECT_TASK, DURABLE_TASK, DURABLE_TTR
from .idle import _rss_mb
from .pairs import across, median_ratio, ratios_of
from .processes import Processes, flush_broker
from .progress import note
from .workload import due_times, wait_for_starts, wait_until, warm_worker

SCENARIOS = ("durable_spread", "durable_memory", "durable_restart", "durable_cost", "durable_cpu")
VARIANTS = {
    "durable_spread": ("durable", "celery_eta"),
    "durable_memory": ("idle", "celery_eta", "durable"),
    "durable_restart": ("durable", "celery_eta"),
    "durable_cost": ("durable", "celery_eta"),
    "durable_cpu": ("durable", "celery_plain"),
}
LABELS = {"durable": "DurableTask", "celery_eta": "Celery's ETA", "idle": "idle worker",
          "celery_plain": "plain Celery message"}
TASKS = {"durable": DURABLE_TASK, "celery_eta": DIRECT_TASK}
CELERY_QUEUE = "celery"  # where the worker's default queue lives in Redis
REDIS_UNACKED = "unacked"  # kombu's Redis transport: messages delivered and not yet acknowledged
# durable_cpu: the ratios per repeat, CPU ms per call: the total, with the broker, and the groups both have.
CPU_RATIOS = ("total_ms", "total_with_broker_ms", "caller_ms", "worker_main_ms", "worker_pool_ms", "postgres_ms")
LATE = 1.0  # seconds: a call started later than this after its due time is late
CALLS_SHOWN = 10  # durable_restart: the late calls outside the catch-up shown one by one
COUNTDOWN = 3600.0  # durable_cost and durable_memory: calls due in an hour


def run(ctx, scenario, rep) -> dict:
    variants = VARIANTS[scenario]
    order = variants if rep % 2 == 0 else tuple(reversed(variants))
    return {variant: _one(ctx, scenario, variant, rep) for variant in order}


def _one(ctx, scenario, variant, rep) -> dict:
    reset(ctx.conn)
    flush_broker(ctx.cfg.broker_url)
    procs = Processes(env=ctx.env, cwd=ctx.cwd, log_dir=ctx.log_dir, label=f"{scenario}/{variant}/rep{rep + 1}")
    try:
        return {"durable_spread": _spread, "durable_memory": _memory, "durable_restart": _restart,
                "durable_cost": _cost, "durable_cpu": _cpu}[scenario](ctx, procs, variant, rep)
    finally:
        procs.stop_all()


def calls(ctx, variant, *, n, lead=0.0, window=0.0, countdown=None, probe=0, seed=1, task=None, env=None) -> dict:
    """Make the calls from a child process (benchmarks.calls); its JSON line, base parsed."""
    args = [sys.executable, "-m", "benchmarks.calls", "--app", ctx.cfg.celery_app, "--task", task or TASKS[variant],
            "--n", str(n), "--lead", str(lead), "--window", str(window), "--seed", str(seed),
            "--probe", str(probe)]
    if countdown is not None:
        args += ["--countdown", str(countdown)]
    done = subprocess.run(args, env=env or ctx.env, cwd=ctx.cwd, stdout=subprocess.PIPE, stderr=None, text=True,
                          timeout=max(300.0, n / 200.0), check=False)
    if done.returncode != 0:
        raise BenchError(f"benchmarks.calls exited with {done.returncode}: {done.stdout[-1000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    out["base"] = datetime.fromisoformat(out["base"])
    return out


def _worker(ctx, procs):
    cfg = ctx.cfg
    process = procs.worker(app=cfg.celery_app, concurrency=cfg.concurrency)
    warm_worker(ctx.app, ctx.conn, count=2 * cfg.concurrency, check=procs.check)
    return process


def expected_due_times(made, n, window, seed):
    """{index: due time} of the n calls made (benchmarks.calls), as it spread them."""
    return dict(enumerate(due_times("spread", n, base=made["base"], window=window, seed=seed)))


def _spread(ctx, procs, variant, rep) -> dict:
    cfg = ctx.cfg
    n = cfg.n_durable_spread
    _worker(ctx, procs)
    if variant == "durable":
        procs.dispatcher(cfg.dispatcher_args)
    made = calls(ctx, variant, n=n, lead=cfg.lead, window=cfg.window, probe=2 * cfg.concurrency, seed=cfg.seed + rep)
    expected = expected_due_times(made, n, cfg.window, cfg.seed + rep)
    wait = max(expected.values()).timestamp() - time.time() + cfg.wait_tail + n / 100.0
    wait_for_starts(ctx.conn, n, deadline=time.monotonic() + wait, check=procs.check,
                    label=f"durable_spread {variant}: started")
    out = stats.analyze(expected, stats.direct_starts(ctx.conn))
    return {**_clean(out), "sched_per_s": made["sched_per_s"], "sched_overrun": made["sched_overrun"]}


def _memory(ctx, procs, variant, rep) -> dict:
    cfg = ctx.cfg
    n = cfg.n_durable_memory
    worker = _worker(ctx, procs)
    out = {"n": 0 if variant == "idle" else n}
    if variant == "durable":
        dispatcher = procs.dispatcher(cfg.dispatcher_args)
    if variant != "idle":
        made = calls(ctx, variant, n=n, lead=COUNTDOWN, window=60.0, seed=cfg.seed + rep)
        out["sched_per_s"] = made["sched_per_s"]
    if variant == "celery_eta":
        _wait_held(cfg.broker_url, n, procs, cfg.drain_timeout)
    time.sleep(cfg.memory_settle)
    procs.check()
    out["rss_mb"] = _rss_mb(worker.pid)
    if variant == "durable":
        out["dispatcher_rss_mb"] = _rss_mb(dispatcher.pid)
        out["stored"] = ctx.conn.execute("SELECT count(*) FROM timeouts_task WHERE biz_type = %s",
                                         (biz_type_for(DURABLE_TASK),)).fetchone()[0]
    return out


def _wait_held(broker_url, n, procs, timeout):
    """Until the worker has taken every ETA message off the queue (Celery holds them in memory,
    each unacknowledged in the broker until its time comes)."""
    import redis

    client = redis.Redis.from_url(broker_url)
    try:
        wait_until(lambda: client.llen(CELERY_QUEUE) == 0 and client.hlen(REDIS_UNACKED) >= n,
                   timeout, procs.check, f"the worker to take {n} ETA messages", interval=0.5)
    finally:
        client.close()


def _restart(ctx, procs, variant, rep) -> dict:
    cfg = ctx.cfg
    n, window = cfg.n_durable_restart, cfg.restart_to - cfg.restart_from
    worker = _worker(ctx, procs)
    if variant == "durable":
        procs.dispatcher(cfg.dispatcher_args)
        procs.scan_loop(interval=cfg.scan_interval)
    made = calls(ctx, variant, n=n, lead=cfg.restart_from, window=window, probe=2 * cfg.concurrency,
                 seed=cfg.seed + rep)
    expected = expected_due_times(made, n, window, cfg.seed + rep)
    calls_began = made["base"].timestamp() - cfg.restart_from
    _sleep_until(calls_began + cfg.restart_kill_at, procs)
    killed_at = _kill(procs, worker)
    note(f"durable_restart {variant}: killed every worker process -9; a new worker in {cfg.restart_down:.0f} s")
    _sleep_until(killed_at + cfg.restart_down, procs)
    restarted_at = time.time()
    procs.worker(app=cfg.celery_app, concurrency=cfg.concurrency)
    # DurableTask finds a call lost in the dead worker when its lease (DURABLE_TTR) runs out and a
    # scan follows, and runs every stored call however long the backlog: wait for all of them (up
    # to drain_timeout). Celery's ETA messages held by the dead worker come back after Redis's
    # visibility timeout (an hour): the bench does not wait for that.
    tail = max(cfg.drain_timeout, DURABLE_TTR + 2 * cfg.scan_interval) if variant == "durable" else cfg.wait_tail
    wait = max(expected.values()).timestamp() - time.time() + tail
    deadline = time.monotonic() + wait
    wait_for_starts(ctx.conn, n, deadline=deadline, check=procs.check, label=f"durable_restart {variant}: started")
    if variant == "durable":  # a call the kill interrupted runs again once its lease runs out: wait for it too
        try:
            wait_until(lambda: _waiting(ctx, variant) == 0, max(0.0, deadline - time.monotonic()), procs.check,
                       "every stored call to end")
        except TimeoutError:
            pass  # reported as `waiting`
    starts = stats.direct_starts(ctx.conn)
    out = _clean(stats.analyze(expected, starts))
    out["waiting"] = _waiting(ctx, variant)
    back = min((at.timestamp() for _, at in starts if at.timestamp() > restarted_at), default=time.time())
    out.update(_late(expected, starts, killed_at, back, due_per_s=n / window))
    out.update(_twice(expected, starts, killed_at, restarted_at))
    out.update(killed_after_s=round(killed_at - calls_began, 1), down_s=round(restarted_at - killed_at, 1),
               outage_s=round(back - killed_at, 1),
               waited_s=round(time.time() - calls_began, 1))
    return out


def _waiting(ctx, variant) -> int:
    """Calls that have not run but still will: DurableTask's rows not yet ended, or the messages
    Redis holds unacknowledged for the dead worker (redelivered after the visibility timeout)."""
    if variant == "durable":
        return ctx.conn.execute("SELECT count(*) FROM timeouts_task WHERE biz_type = %s AND finished_at IS NULL",
                                (biz_type_for(DURABLE_TASK),)).fetchone()[0]
    import redis

    client = redis.Redis.from_url(ctx.cfg.broker_url)
    try:
        return client.hlen(REDIS_UNACKED)
    finally:
        client.close()


def _late(expected, starts, outage_from, outage_to, due_per_s=None) -> dict:
    """Late calls (first start over LATE s after the due time), and how many of them were due in
    the outage: from the kill to the new worker's first start.

    `catch_up_per_s` is how fast the new worker ran the backlog: the late calls it started, per
    second, over the middle 90 % of their start times (the few calls found only when their lease
    ran out start seconds later, and would stretch the span).

    `late_outside_catch_up` counts the late calls that started outside the outage and its catch-up:
    before the kill (the workers lagged), or after the catch-up, whatever their due time (a call the
    killed worker held, run again only once its lease ran out). The catch-up is the T x A / (C - A)
    seconds after the outage that the durable-task how-to gives for workers running C calls a second
    (`catch_up_per_s`) while A fall due (`due_per_s`), after an outage of T seconds; a call starts
    within LATE of its due time again from its end. A call due just before the kill that had not
    started by then is the outage's too, as are those due in it. Workers no faster than the calls
    falling due never catch up, and are given no catch-up."""
    first = {}
    for key, started_at in starts:
        if key in expected and (key not in first or started_at < first[key]):
            first[key] = started_at
    late = [k for k, at in first.items() if (at - expected[k]).total_seconds() > LATE]
    in_outage = [k for k in late if outage_from <= expected[k].timestamp() < outage_to]
    due_in_outage = sum(1 for at in expected.values() if outage_from <= at.timestamp() < outage_to)
    catch_up = stats.rate_of_middle(sorted(first[k].timestamp() for k in late if first[k].timestamp() >= outage_to))
    out = {"late": len(late), "late_in_outage": len(in_outage), "late_outside_outage": len(late) - len(in_outage),
           "due_in_outage": due_in_outage, "catch_up_per_s": catch_up}
    if due_per_s is not None:
        caught_up = outage_to
        if catch_up is not None and catch_up > due_per_s:
            caught_up += (outage_to - outage_from) * due_per_s / (catch_up - due_per_s)
        outside = sorted(k for k in late if not outage_from <= first[k].timestamp() < caught_up + LATE)
        out["late_outside_catch_up"] = len(outside)
        # Each such call's due time from the kill and its lateness, seconds: what made it late shows
        # in them (late by a lease, or late before the kill).
        out["late_outside_catch_up_calls"] = [
            (round(expected[k].timestamp() - outage_from, 3), round((first[k] - expected[k]).total_seconds(), 3))
            for k in outside[:CALLS_SHOWN]]
    return out


def _twice(expected, starts, killed_at, restarted_at) -> dict:
    """Calls run twice: those running when every worker was killed (a first start by the killed
    worker, the next by the new one), which may run twice (at least once: the kill came before their
    outcome was recorded), and the others, which are a fault of the fence. The killed worker's
    starts are those before the restart: killed_at is read just before the signal, which its
    processes take a moment to receive, and no worker runs from then until the restart.
    `twice_started_before_kill_ms` is the longest time from such a first start to killed_at: the
    length of a run, if they were running (negative: started in that moment)."""
    times = {}
    for key, started_at in starts:
        if key in expected:
            times.setdefault(key, []).append(started_at.timestamp())
    twice = [sorted(t) for t in times.values() if len(t) > 1]
    at_kill = [t[0] for t in twice if len(t) == 2 and t[0] < restarted_at <= t[1]]
    before_kill = max((killed_at - t) * 1000.0 for t in at_kill) if at_kill else None
    return {"duplicates_at_kill": len(at_kill),
            "duplicates_other": sum(len(t) - 1 for t in twice) - len(at_kill),
            "twice_started_before_kill_ms": None if before_kill is None else round(before_kill, 1)}


def _cost(ctx, procs, variant, rep) -> dict:
    made = calls(ctx, variant, n=ctx.cfg.n_durable_cost, countdown=COUNTDOWN)
    return {"n": made["n"], "sched_per_s": made["sched_per_s"]}


def _kill(procs, process) -> float:
    """SIGKILL the worker's whole process group (its main process and its pool processes)."""
    procs.running = [(name, p) for name, p in procs.running if p is not process]
    killed_at = time.time()
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(10)
    return killed_at


def _sleep_until(epoch, procs):
    while time.time() < epoch:
        procs.check()
        time.sleep(min(0.2, max(0.0, epoch - time.time())))


def _clean(out) -> dict:
    out.pop("first_start", None)
    out.pop("last_start", None)
    return out


def ratios(runs) -> dict:
    """Per repeat: DurableTask against Celery's ETA, against the idle worker, and against a plain
    message; and the restart's catch-up against Celery direct's drain."""
    out = ratios_of(runs, [(scenario, a, b, metric) for scenario, a, b, metrics in (
        ("durable_spread", "durable", "celery_eta", ("p50_ms", "p99_ms", "max_ms")),
        ("durable_memory", "durable", "idle", ("rss_mb",)),
        ("durable_memory", "celery_eta", "idle", ("rss_mb",)),
        ("durable_cost", "durable", "celery_eta", ("sched_per_s",)),
        ("durable_cpu", "durable", "celery_plain", CPU_RATIOS)) for metric in metrics])
    # The restart's catch-up against the drain scenario's Celery direct path in the same repeat:
    # the same body, one message a call, on the same worker (measured when the run has both).
    catch_up = across(runs, ("durable_restart", "durable", "catch_up_per_s"), ("drain", "celery", "start_per_s"))
    if catch_up:
        out.setdefault("durable_restart", {})["durable/celery_drain"] = {"catch_up_per_s": catch_up}
    return out


def targets(summary, ratio_table) -> list:
    """(scenario, target, measured, check) rows, as targets.targets() lists them."""
    def ratio(scenario, pair, metric):
        return median_ratio(ratio_table, scenario, pair, metric)

    def worst(scenario, path, metrics, *more_paths):
        values = [summary.get(scenario, {}).get(p, {}).get(m) for p in (path, *more_paths) for m in metrics]
        return None if any(v is None for v in values) else sum(v["max"] for v in values)

    return [
        ("durable_spread", "durable_spread: DurableTask lateness p50 / Celery ETA's <= 1.0",
         ratio("durable_spread", "durable/celery_eta", "p50_ms"), lambda v: v <= 1.0),
        ("durable_spread", "durable_spread: DurableTask lateness p99 / Celery ETA's <= 1.0",
         ratio("durable_spread", "durable/celery_eta", "p99_ms"), lambda v: v <= 1.0),
        ("durable_spread", "durable_spread, DurableTask: missing + duplicates + early = 0 (every run)",
         worst("durable_spread", "durable", ("missing", "duplicates", "early")), lambda v: v == 0),
        ("durable_memory", "durable_memory: worker RSS with DurableTask calls waiting / idle worker's <= 1.10",
         ratio("durable_memory", "durable/idle", "rss_mb"), lambda v: v <= 1.10),
        ("durable_restart", "durable_restart, DurableTask: lost + early = 0 (every run)",
         worst("durable_restart", "durable", ("missing", "early")), lambda v: v == 0),
        ("durable_restart", "durable_restart, DurableTask: run twice, other than running at the kill = 0 (every run)",
         worst("durable_restart", "durable", ("duplicates_other",)), lambda v: v == 0),
        ("durable_restart", "durable_restart, DurableTask: late outside the outage and its catch-up = 0 (every run)",
         worst("durable_restart", "durable", ("late_outside_catch_up",)), lambda v: v == 0),
        ("durable_restart", "durable_restart: DurableTask's catch-up / Celery direct's drain (drain scenario) >= 0.8",
         ratio("durable_restart", "durable/celery_drain", "catch_up_per_s"), lambda v: v >= 0.8),
        ("durable_cpu", "durable_cpu: DurableTask CPU per call / a plain Celery message's <= 1.25 (caller, worker, "
         "dispatcher, PostgreSQL sessions; net of idle)",
         ratio("durable_cpu", "durable/celery_plain", "total_ms"), lambda v: v <= 1.25),
        ("durable_cpu", "durable_cpu: missing + duplicates = 0 (every run, both variants)",
         worst("durable_cpu", "durable", ("missing", "duplicates"), "celery_plain"), lambda v: v == 0),
    ]
