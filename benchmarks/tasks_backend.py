"""Django's tasks framework through `timeouts.backends.TimeoutsBackend`, against django-tasks-db's
`db_worker` on the same workload (the peer harness's django_tasks system, `--peers django_tasks`),
run back to back in each repeat.

- tasks_spread: N tasks enqueued with `run_after` spread over the window; lateness of the start.
- tasks_drain: N tasks enqueued ready to run, then the dispatcher starts: starts per second.
- tasks_enqueue: N `enqueue()` calls due in an hour, no worker: enqueues per second.

Every process of these runs (worker, dispatcher, the enqueuing process) loads
`benchmarks.settings_tasks`, where TASKS names the backend. The task is benchmarks.django_task.
"""

import time

from . import stats
from .calls import DJANGO_TASK
from .database import reset
from .durable import calls, expected_due_times
from .pairs import by_rep
from .processes import Processes, flush_broker
from .workload import wait_for_starts, warm_worker

SCENARIOS = ("tasks_spread", "tasks_drain", "tasks_enqueue")
SETTINGS = "benchmarks.settings_tasks"
PEER = "django_tasks"
# Our metric and the django_tasks peer's, for each scenario's ratio.
PEER_METRICS = {"tasks_spread": (("p50_ms", "p50_ms"), ("p99_ms", "p99_ms")),
                "tasks_drain": (("start_per_s", "drain_per_s"),),
                "tasks_enqueue": (("sched_per_s", "schedule_per_s"),)}
LABELS = {"timeouts": "TimeoutsBackend", PEER: "django-tasks-db db_worker"}
ENQUEUE_LEAD = 3600.0  # tasks_enqueue: due in an hour, as the peer's


def available() -> bool:
    """Django's tasks framework, or its backport, and the backend are importable here."""
    try:
        from timeouts.backends import TimeoutsBackend  # noqa: F401
        from timeouts.backends.compat import BaseTaskBackend  # noqa: F401
    except ImportError:
        return False
    return True


def run(ctx, scenario, rep) -> dict:
    cfg = ctx.cfg
    reset(ctx.conn)
    flush_broker(cfg.broker_url)
    env = {**ctx.env, "DJANGO_SETTINGS_MODULE": SETTINGS}
    procs = Processes(env=env, cwd=ctx.cwd, log_dir=ctx.log_dir, label=f"{scenario}/rep{rep + 1}")
    try:
        if scenario == "tasks_enqueue":
            made = calls(ctx, None, task=DJANGO_TASK, env=env, n=cfg.n_tasks_enqueue, lead=ENQUEUE_LEAD)
            return {"timeouts": {"n": made["n"], "sched_per_s": made["sched_per_s"]}}
        procs.worker(app=cfg.celery_app, concurrency=cfg.concurrency)
        warm_worker(ctx.app, ctx.conn, count=2 * cfg.concurrency, check=procs.check)
        if scenario == "tasks_spread":
            return {"timeouts": _spread(ctx, procs, env, rep)}
        return {"timeouts": _drain(ctx, procs, env)}
    finally:
        procs.stop_all()


def _spread(ctx, procs, env, rep) -> dict:
    cfg, n = ctx.cfg, ctx.cfg.n_tasks_spread
    procs.dispatcher(cfg.dispatcher_args)
    made = calls(ctx, None, task=DJANGO_TASK, env=env, n=n, lead=cfg.lead, window=cfg.window,
                 probe=2 * cfg.concurrency, seed=cfg.seed + rep)
    expected = expected_due_times(made, n, cfg.window, cfg.seed + rep)
    wait = max(expected.values()).timestamp() - time.time() + cfg.wait_tail + n / 100.0
    wait_for_starts(ctx.conn, n, deadline=time.monotonic() + wait, check=procs.check, label="tasks_spread: started")
    out = stats.analyze(expected, stats.direct_starts(ctx.conn))
    return {**_clean(out), "sched_per_s": made["sched_per_s"], "sched_overrun": made["sched_overrun"]}


def _drain(ctx, procs, env) -> dict:
    """The backlog is in the table (and ANALYZEd) before the dispatcher starts, as the peer's is
    before its db_worker starts."""
    cfg, n = ctx.cfg, ctx.cfg.n_tasks_drain
    made = calls(ctx, None, task=DJANGO_TASK, env=env, n=n, lead=-1.0)
    ctx.conn.execute("ANALYZE timeouts_task")
    started = time.time()
    procs.dispatcher(cfg.dispatcher_args)
    wait_for_starts(ctx.conn, n, deadline=time.monotonic() + cfg.drain_timeout, check=procs.check,
                    label="tasks_drain: started")
    expected = dict.fromkeys(range(n), made["base"])
    out = stats.analyze(expected, stats.direct_starts(ctx.conn))
    if out.get("last_start"):
        out["drain_total_s"] = round(out["last_start"].timestamp() - started, 2)
    return {**_clean(out), "sched_per_s": made["sched_per_s"]}


def _clean(out) -> dict:
    out.pop("first_start", None)
    out.pop("last_start", None)
    return out


def ratios(runs, peer_runs) -> dict:
    """Per repeat: TimeoutsBackend's number over the django-tasks-db peer's."""
    out = {}
    for scenario, metrics in PEER_METRICS.items():
        ours = [r for r in runs if r.get("scenario") == scenario and r.get("path") == "timeouts"]
        theirs = [p for p in peer_runs if p.get("system") == PEER and p.get("bench_scenario") == scenario]
        for ours_metric, their_metric in metrics:
            s = by_rep(ours, theirs, ours_metric, their_metric)
            if s:
                out.setdefault(scenario, {}).setdefault(f"timeouts/peer:{PEER}", {})[ours_metric] = s
    return out


def targets(summary, ratio_table) -> list:
    def ratio(scenario, metric):
        s = ratio_table.get(scenario, {}).get(f"timeouts/peer:{PEER}", {}).get(metric)
        return None if s is None else round(s["median"], 4)

    def worst(scenario, metrics):
        values = [summary.get(scenario, {}).get("timeouts", {}).get(m) for m in metrics]
        return None if any(v is None for v in values) else sum(v["max"] for v in values)

    return [
        ("tasks_spread", "tasks_spread: TimeoutsBackend lateness p50 / django-tasks-db's <= 0.01 (100x lower)",
         ratio("tasks_spread", "p50_ms"), lambda v: v <= 0.01),
        ("tasks_spread", "tasks_spread, TimeoutsBackend: missing + duplicates + early = 0 (every run)",
         worst("tasks_spread", ("missing", "duplicates", "early")), lambda v: v == 0),
        ("tasks_drain", "tasks_drain: TimeoutsBackend starts/s / django-tasks-db's >= 2",
         ratio("tasks_drain", "start_per_s"), lambda v: v >= 2),
        ("tasks_drain", "tasks_drain, TimeoutsBackend: missing + duplicates = 0 (every run)",
         worst("tasks_drain", ("missing", "duplicates")), lambda v: v == 0),
        ("tasks_enqueue", "tasks_enqueue: TimeoutsBackend enqueue()/s / django-tasks-db's >= 0.8",
         ratio("tasks_enqueue", "sched_per_s"), lambda v: v >= 0.8),
    ]
