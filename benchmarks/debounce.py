"""debounce: N keys, each scheduled CALLS times in a row by several writer processes at once, with
on_conflict="debounce" (and max_wait) against on_conflict="replace" on the same workload.

Each writer (benchmarks.debounce_writer) makes its share of the calls as fast as it goes: the keys
go by in blocks of `debounce_block`, and each block takes CALLS rounds, a round one call per key,
each call of a key by the next writer in turn (plan()). So every key gets all its calls within a
short while, from more than one process, well within its `debounce_delay`: a debounced key keeps
one task, moved by each call, due `debounce_delay` after its last call but never later than
`debounce_max_wait` after its first; a replaced key gets a new task per call, each cancelling the
one before. The dispatcher and a worker run throughout, so every key's task runs, and is checked:

- calls_per_s: all the writers' calls over the time from the first writer's start to the last one's end;
- missing, duplicates, early: a task not cancelled that never started, started twice, started
  before its action_time; and a cancelled task that started (cancelled_started);
- keys_run_once, keys_run_more, keys_not_run: how often each key's handler ran (once, by the rules,
  when its calls all came before its task was claimed); keys_run_more counts a key whose later
  task came from a call made while the one before was still PENDING, which debounce should have
  moved instead; keys_called_late a key whose later task came from a call made after the one
  before was claimed, where a new task is the rule (the writers drift apart on a slow machine, so
  a key's last calls can come after its first's max_wait);
- over_cap: debounced tasks due more than max_wait after their first scheduling (created_at);
  first_to_start_max_s: the longest from a key's first scheduling to its start, which is at most
  max_wait plus the dispatcher's lateness (p50_ms, p99_ms, max_ms: started_at - action_time);
- capped: debounced tasks due exactly at that cap.

The two variants run one after the other in each repeat, in alternating order, each on an empty
table with its own worker and dispatcher; the load average is recorded with each (the machine is
shared).
"""

import sys
import time
from datetime import timedelta
from itertools import pairwise

from timeouts.states import Status

from . import machine
from .database import reset
from .handlers import NOOP
from .held_process import HeldProcess
from .pairs import median_ratio, ratios_of
from .processes import Processes, flush_broker
from .progress import note
from .stats import pct, rnd
from .workload import probe_path, wait_until, warm_worker

SCENARIOS = ("debounce",)
VARIANTS = ("replace", "debounce")
LABELS = {"replace": 'schedule(on_conflict="replace")', "debounce": 'schedule(on_conflict="debounce", max_wait=...)'}
METRICS = ("calls_per_s", "missing", "duplicates", "early", "cancelled_started", "keys_run_once", "keys_run_more",
           "keys_called_late", "keys_not_run", "over_cap", "capped", "first_to_start_max_s", "p50_ms", "p99_ms",
           "max_ms", "loadavg_1min", "cpu_steal_pct")
HEADERS = ["calls/s", "missing", "dup", "early", "cancelled ran", "keys run once", "keys run more",
           "keys called after a claim", "keys not run", "over max_wait", "capped", "first call to start, max s",
           "p50 ms", "p99 ms", "max ms", "load 1 min", "steal %"]
TITLE = ("{n_debounce:,} keys, {debounce_calls} calls each by {debounce_writers} writer processes, "
         "delay {debounce_delay:g} s, max_wait {debounce_max_wait:g} s (debounce only)")
READY_TIMEOUT = 120.0  # seconds for a writer to set up and warm its connection
RESULT_TIMEOUT = 3600.0  # seconds for a writer to make its calls
# The tasks of the bench's biz_type, with their start rows (none, one, or more).
ROWS = """
SELECT t.biz_id, t.job_id, t.status, t.created_at, t.action_time, t.dispatched_at, s.started_at
FROM timeouts_task AS t LEFT JOIN timeouts_bench_start AS s ON s.job_id = t.job_id
WHERE t.biz_type = %s
"""
UNFINISHED = "SELECT count(*) FROM timeouts_task WHERE biz_type = %s AND status = ANY(%s)"


# --- the pure parts ----------------------------------------------------------------------------------

def plan(keys: int, calls: int, writers: int, block: int, writer: int) -> list[tuple[int, int]]:
    """The (round, key) of each call of `writer` (0 to writers - 1), in the order it makes them:
    block after block of keys, CALLS rounds per block, and in each round the keys whose turn it is
    this writer's ((key + round) % writers), so that each key's calls come from the writers in turn."""
    out = []
    for first in range(0, keys, block):
        block_keys = range(first, min(keys, first + block))
        for round_ in range(calls):
            out += [(round_, key) for key in block_keys if (key + round_) % writers == writer]
    return out


def calls_per_s(results: list[dict]) -> float | None:
    """All the writers' calls over the time from the first one's start to the last one's end."""
    if not results:
        return None
    span = max(r["finished"] for r in results) - min(r["started"] for r in results)
    return round(sum(r["calls"] for r in results) / span) if span > 0 else None


def analyze(rows, max_wait: timedelta | None) -> dict:
    """The checks of one run from ROWS: (biz_id, job_id, status, created_at, action_time,
    dispatched_at, started_at or None), a row per start (one with None for a task that never
    started). `max_wait`: the debounced run's, for over_cap and capped (None for replace)."""
    tasks, starts, ran = {}, {}, {}
    for biz_id, job_id, status, created_at, action_time, dispatched_at, started_at in rows:
        tasks[job_id] = (biz_id, status, created_at, action_time, dispatched_at)
        if started_at is not None:
            starts.setdefault(job_id, []).append(started_at)
    missing = duplicates = early = cancelled_started = over_cap = capped = 0
    runs, first_created, first_started, lateness = {}, {}, {}, []
    for job_id, (biz_id, status, created_at, action_time, dispatched_at) in tasks.items():
        started = sorted(starts.get(job_id, []))
        first_created[biz_id] = min(created_at, first_created.get(biz_id, created_at))
        runs.setdefault(biz_id, 0)
        if max_wait is not None:
            over_cap += action_time - created_at > max_wait
            capped += action_time - created_at == max_wait
        if status == Status.CANCELLED:
            cancelled_started += bool(started)
            continue
        if not started:
            missing += 1
            continue
        runs[biz_id] += 1
        ran.setdefault(biz_id, []).append((created_at, dispatched_at))
        duplicates += len(started) - 1
        early += sum(at < action_time for at in started)
        lateness.append((started[0] - action_time).total_seconds() * 1000.0)
        first_started[biz_id] = min(started[0], first_started.get(biz_id, started[0]))
    lateness.sort()
    called_late = {key for key, tasks_run in ran.items() if len(tasks_run) > 1 and _called_after_claims(tasks_run)}
    to_start = [(first_started[key] - first_created[key]).total_seconds() for key in first_started]
    return {
        "keys": len(runs), "tasks": len(tasks), "missing": missing, "duplicates": duplicates, "early": early,
        "cancelled_started": cancelled_started, "over_cap": over_cap, "capped": capped,
        "keys_run_once": sum(n == 1 for n in runs.values()),
        "keys_run_more": sum(n > 1 and key not in called_late for key, n in runs.items()),
        "keys_called_late": len(called_late),
        "keys_not_run": sum(n == 0 for n in runs.values()),
        "first_to_start_max_s": rnd(max(to_start)) if to_start else None,
        "p50_ms": rnd(pct(lateness, 50)), "p99_ms": rnd(pct(lateness, 99)),
        "max_ms": rnd(lateness[-1] if lateness else None),
    }


def _called_after_claims(tasks_run) -> bool:
    """Whether each of a key's tasks that ran, (created_at, dispatched_at), but its first was created
    after the one before it was claimed: by a call that found no PENDING task to move."""
    return all(before[1] is not None and after[0] >= before[1] for before, after in pairwise(sorted(tasks_run)))


# --- a run -------------------------------------------------------------------------------------------

def run(ctx, scenario, rep) -> dict:
    order = VARIANTS if rep % 2 == 0 else tuple(reversed(VARIANTS))
    return {variant: _one(ctx, variant, rep) for variant in order}


def _one(ctx, variant, rep) -> dict:
    cfg = ctx.cfg
    reset(ctx.conn)
    flush_broker(cfg.broker_url)
    procs = Processes(env=ctx.env, cwd=ctx.cwd, log_dir=ctx.log_dir, label=f"debounce/{variant}/rep{rep + 1}")
    writers = []
    try:
        procs.worker(app=cfg.celery_app, concurrency=cfg.concurrency)
        warm_worker(ctx.app, ctx.conn, count=2 * cfg.concurrency, check=procs.check)
        procs.dispatcher(cfg.dispatcher_args)
        probe_path(ctx.alias, ctx.conn, count=2, check=procs.check, timeout=cfg.scan_interval + 60)
        writers = [_writer(ctx, variant, index) for index in range(cfg.debounce_writers)]
        for writer in writers:
            writer.wait_ready(READY_TIMEOUT, procs.check)
        load = machine.loadavg()[0]
        note(f"debounce {variant}: {cfg.n_debounce * cfg.debounce_calls:,} calls by {len(writers)} writers")
        for writer in writers:
            writer.go()
        results = [writer.result(RESULT_TIMEOUT, procs.check) for writer in writers]
        waited = cfg.debounce_delay + cfg.debounce_max_wait + cfg.wait_tail
        wait_until(lambda: _unfinished(ctx) == 0, waited, procs.check, f"every debounce {variant} task to finish")
        time.sleep(1.0)  # a second start of a task has time to show
        max_wait = timedelta(seconds=cfg.debounce_max_wait) if variant == "debounce" else None
        out = analyze(ctx.conn.execute(ROWS, (NOOP,)).fetchall(), max_wait)
        out.update(calls=sum(r["calls"] for r in results), calls_per_s=calls_per_s(results), loadavg_1min=load)
        return out
    finally:
        for writer in writers:
            writer.stop()
        procs.stop_all()


def _unfinished(ctx) -> int:
    waiting = [int(Status.PENDING), int(Status.DISPATCHED), int(Status.RUNNING)]
    return ctx.conn.execute(UNFINISHED, (NOOP, waiting)).fetchone()[0]


def _writer(ctx, variant, index) -> HeldProcess:
    """One writer process (benchmarks.debounce_writer), held until go(): then it makes its calls and
    prints what it did."""
    cfg = ctx.cfg
    args = [sys.executable, "-m", "benchmarks.debounce_writer", "--mode", variant, "--writer", str(index),
            "--writers", str(cfg.debounce_writers), "--keys", str(cfg.n_debounce), "--calls",
            str(cfg.debounce_calls), "--block", str(cfg.debounce_block), "--delay", str(cfg.debounce_delay)]
    if variant == "debounce":
        args += ["--max-wait", str(cfg.debounce_max_wait)]
    return HeldProcess(args, env=ctx.env, cwd=ctx.cwd, name=f"debounce writer {index}",
                       log=ctx.log_dir / f"debounce_writer{index}.log")


# --- ratios and targets ------------------------------------------------------------------------------

def ratios(runs) -> dict:
    return ratios_of(runs, [("debounce", "debounce", "replace", "calls_per_s")])


def targets(summary, ratio_table) -> list:
    def worst(variants, metrics):
        """The sum of the metrics' worst runs over the variants; None if one was not measured."""
        values = [summary.get("debounce", {}).get(v, {}).get(m) for v in variants for m in metrics]
        return None if any(v is None for v in values) else sum(v["max"] for v in values)

    return [
        ("debounce", 'debounce: calls/s, on_conflict="debounce" / "replace" >= 0.9',
         median_ratio(ratio_table, "debounce", "debounce/replace", "calls_per_s"), lambda v: v >= 0.9),
        ("debounce", "debounce: missing + duplicates + early + cancelled started = 0 (every run, both variants)",
         worst(VARIANTS, ("missing", "duplicates", "early", "cancelled_started")), lambda v: v == 0),
        ("debounce", "debounce: each key runs once (every run)",
         worst(("debounce",), ("keys_run_more", "keys_not_run")), lambda v: v == 0),
        ("debounce", "debounce: no task due more than max_wait after its first scheduling (every run)",
         worst(("debounce",), ("over_cap",)), lambda v: v == 0),
    ]
