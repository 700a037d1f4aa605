"""late_recovery: after an outage of every worker, how soon is on-time work on time again, with a
lateness policy on half of what fell due meanwhile, against the same outage without it.

Each variant runs one worker (`concurrency` processes), the dispatcher and the scan loop (as a
deployment runs beat's scan: it gives back the leases that ran out during the outage), then:

- the worker stops (SIGTERM, with nothing running: nothing is cut off) and a new one starts
  `--outage` seconds later (the restart: recovery is timed from it);
- N tasks (`--n-late`) fall due uniformly over the outage, half of `benchmarks.skippable`, whose
  handler declares max_lateness=SKIP_AFTER, on_late="skip", half of `benchmarks.must_run` (no policy);
- the on-time stream: STREAM_RATE tasks a second of `benchmarks.must_run`, due one after another
  from the restart for `--late-stream` seconds: work that must run, claimed after its own
  biz_type's backlog (oldest first within a biz_type).

Both handlers record their start, then wait `--late-work-ms` (0: none), as a handler's I/O would:
what a skipped task is spared. The dispatcher runs through the outage, so a skippable task that is
over SKIP_AFTER late while it waits is ended by its sweep (dispatch/late_sweep.py) and never
reaches the worker; only those claimed before they were that late (waiting in the broker for the
new worker) are ended by their start, each a claim, a message and a statement. Without the policy
the worker runs both halves, with it one half and those few skips.
The stream lasts long enough for the recovery without the policy to fall within it (else None).

Variants: `policy` (the handler's own policy in force, reset_limits()) and `no_policy` (overridden
by set_limits(max_lateness=None): every late task runs, as before the policy existed).

`recovery_s` is the time from the restart to the due time of the first stream task from which on
every one started within ON_TIME of its due time (recovery_time()). Every task must have started
once or, of the skippable ones and only with the policy, ended CANCELLED by a start over
max_lateness, with the last_error that says so (outcome()).
"""

import time
from dataclasses import dataclass
from datetime import datetime, timedelta

import timeouts
from timeouts.limiting.lateness import ended_late
from timeouts.states import Status

from . import machine, stats
from .database import reset
from .handlers import LATE_WORK_MS, MUST_RUN, SKIP_AFTER, SKIPPABLE
from .pairs import median_ratio, ratios_of
from .processes import Processes, flush_broker
from .progress import note
from .workload import db_now, due_times, probe_path, wait_until, warm_worker

SCENARIOS = ("late_recovery",)
VARIANTS = ("policy", "no_policy")
LABELS = {"policy": f"skip over {SKIP_AFTER.total_seconds():g} s late, half the backlog",
          "no_policy": "no lateness policy (every late task runs)"}
METRICS = {"late_recovery": ("recovery_s", "back_s", "drain_s", "stream_late", "stream_p99_after_ms", "skipped",
                             "n", "missing", "duplicates", "early", "skip_errors", "run_over_policy",
                             "loadavg_1min", "cpu_steal_pct")}
HEADERS = {"late_recovery": ["recovery s", "first start s", "backlog done s", "stream late", "stream p99 after, ms",
                             "skipped", "tasks", "lost", "dup", "early", "wrongly skipped", "run over policy",
                             "load 1 min", "steal %"]}
STREAM_RATE = 20.0  # on-time stream tasks falling due per second, from the restart
ON_TIME = timedelta(milliseconds=100)  # a stream task started within this of its due time is on time
STREAM, BACKLOG = "stream-", "late-"  # biz_id prefixes of the stream's tasks and the outage's
TITLES = {"late_recovery": (
    "{n_late:,} tasks due over a {outage:g} s outage of every worker, half of a biz_type that skips a task "
    f"over {SKIP_AFTER.total_seconds():g} s late, handlers that work {{late_work_ms:g}} ms; then {STREAM_RATE:g} "
    "tasks/s of the other due for {late_stream:g} s from the restart (s from the restart; recovery: from when "
    f"every one of them starts within {ON_TIME.total_seconds() * 1000:g} ms)")}

TASKS = """
SELECT t.biz_type, t.biz_id, t.action_time, t.status, t.last_error, t.finished_at,
       count(s.job_id) AS starts, min(s.started_at) AS first_start
FROM timeouts_task AS t LEFT JOIN timeouts_bench_start AS s ON s.job_id = t.job_id
WHERE t.biz_type = ANY(%s)
GROUP BY t.job_id, t.biz_type, t.biz_id, t.action_time, t.status, t.last_error, t.finished_at
"""
UNFINISHED = "SELECT count(*) FROM timeouts_task WHERE biz_type = ANY(%s) AND finished_at IS NULL"


def run(ctx, scenario, rep) -> dict:
    order = VARIANTS if rep % 2 == 0 else tuple(reversed(VARIANTS))
    return {variant: _one(ctx, variant, rep) for variant in order}


def _one(ctx, variant, rep) -> dict:
    cfg = ctx.cfg
    reset(ctx.conn)
    flush_broker(cfg.broker_url)
    # The bench's dispatcher does not import the bench's handlers, so it never declares this
    # policy: reset_limits() writes it as this process's handler declares it.
    if variant == "policy":
        timeouts.reset_limits(SKIPPABLE, using=ctx.alias)
    else:
        timeouts.set_limits(SKIPPABLE, max_lateness=None, using=ctx.alias)
    env = {**ctx.env, LATE_WORK_MS: str(cfg.late_work_ms)}
    procs = Processes(env=env, cwd=ctx.cwd, log_dir=ctx.log_dir, label=f"late_recovery/{variant}/rep{rep + 1}")
    load = machine.loadavg()[0]
    try:
        worker = procs.worker(app=cfg.celery_app, concurrency=cfg.concurrency)
        warm_worker(ctx.app, ctx.conn, count=2 * cfg.concurrency, check=procs.check)
        procs.dispatcher(cfg.dispatcher_args)
        procs.scan_loop(interval=cfg.scan_interval)
        probe_path(ctx.alias, ctx.conn, count=2, check=procs.check, timeout=60)
        procs.stop(worker)
        outage_from = db_now(ctx.conn)
        restart_at = outage_from + timedelta(seconds=cfg.outage)
        stream = _schedule(ctx, outage_from, restart_at, rep)
        note(f"late_recovery {variant}: every worker stopped; a new one in {cfg.outage:g} s")
        _sleep_until(restart_at, procs)
        restarted = db_now(ctx.conn)
        procs.worker(app=cfg.celery_app, concurrency=cfg.concurrency)
        timeout = stream[-1].timestamp() - time.time() + cfg.drain_timeout
        try:
            wait_until(lambda: ctx.conn.execute(UNFINISHED, ([MUST_RUN, SKIPPABLE],)).fetchone()[0] == 0, timeout,
                       procs.check, f"late_recovery {variant}: every task to end", interval=0.5)
        except TimeoutError as exc:
            note(f"late_recovery {variant}: {exc}")  # what has not ended counts as lost
        time.sleep(1.0)  # time for a second start of a task to show
    finally:
        procs.stop_all()
    rows = [Row(*r) for r in ctx.conn.execute(TASKS, ([MUST_RUN, SKIPPABLE],))]
    return {**outcome(rows, policy=variant == "policy", restarted=restarted), "loadavg_1min": load}


def _schedule(ctx, outage_from, restart_at, rep) -> list[datetime]:
    """The outage's tasks, due uniformly over it, every other one skippable, and the stream's, due
    from the restart; returns the stream's due times."""
    cfg = ctx.cfg
    times = due_times("spread", cfg.n_late, base=outage_from, window=cfg.outage, seed=cfg.seed + rep)
    count = max(1, round(cfg.late_stream * STREAM_RATE))
    stream = [restart_at + timedelta(seconds=i / STREAM_RATE) for i in range(count)]
    items = [{"biz_type": SKIPPABLE if i % 2 == 0 else MUST_RUN, "biz_id": f"{BACKLOG}{i}", "at": at}
             for i, at in enumerate(times)]
    items += [{"biz_type": MUST_RUN, "biz_id": f"{STREAM}{i}", "at": at} for i, at in enumerate(stream)]
    items = [{**item, "on_conflict": None} for item in items]
    for i in range(0, len(items), cfg.bulk_chunk):
        timeouts.bulk_schedule(items[i:i + cfg.bulk_chunk], using=ctx.alias)
    return stream


def _sleep_until(at, procs):
    while time.time() < at.timestamp():
        procs.check()
        time.sleep(min(0.2, max(0.0, at.timestamp() - time.time())))


@dataclass(frozen=True)
class Row:
    """A task of the run, with its start rows (the handler's: one per start)."""
    biz_type: str
    biz_id: str
    action_time: datetime
    status: int
    last_error: str
    finished_at: datetime | None
    starts: int
    first_start: datetime | None


def recovery_time(series, since, on_time) -> float | None:
    """Seconds from `since` to the due time of the first task of `series` ([(due time, lateness or
    None if it never started)]) from which on every one started within `on_time` (0 if none was
    late); None if the last one was late: the stream ended before it was on time again."""
    ordered = sorted(series, key=lambda item: item[0])
    late = [i for i, (_, lateness) in enumerate(ordered) if lateness is None or lateness > on_time]
    if not ordered or (late and late[-1] == len(ordered) - 1):
        return None
    if not late:
        return 0.0
    return round(max(0.0, (ordered[late[-1] + 1][0] - since).total_seconds()), 2)


def outcome(rows, *, policy, restarted, max_lateness=SKIP_AFTER, on_time=ON_TIME) -> dict:
    """The numbers of a run from its tasks: recovery, and whether every task ran once or was skipped
    as its policy says.

    lost: neither started nor ended by a late start. skip_errors: tasks CANCELLED other than by the
    policy (another biz_type, the variant without it, within max_lateness, without its last_error,
    or started too) and tasks made DEAD. run_over_policy: skippable tasks started over max_lateness
    late with the policy in force."""
    ran = [r for r in rows if r.starts]
    ended = [r for r in rows if not r.starts and ended_late(r.status, r.last_error)]
    skipped = [r for r in ended if r.status == Status.CANCELLED]

    def rightly_skipped(r):
        return (policy and r.biz_type == SKIPPABLE and not r.starts and ended_late(r.status, r.last_error)
                and r.finished_at - r.action_time > max_lateness)

    stream = [(r.action_time, None if r.first_start is None else r.first_start - r.action_time)
              for r in rows if r.biz_id.startswith(STREAM)]
    recovery = recovery_time(stream, restarted, on_time)
    after = sorted(late.total_seconds() * 1000.0 for due, late in stream if late is not None
                   and recovery is not None and (due - restarted).total_seconds() >= recovery)
    # When each task's start came, or the start that ended it.
    reached = [(r, r.first_start or r.finished_at) for r in ran + ended]
    backlog_done = [at for r, at in reached if r.biz_id.startswith(BACKLOG)]

    def since_restart(moments):
        later = [m for m in moments if m is not None and m >= restarted]
        return round((min(later) - restarted).total_seconds(), 2) if later else None

    return {
        "n": len(rows), "started": len(ran), "skipped": len(skipped),
        "missing": len(rows) - len(ran) - len(ended),
        "duplicates": sum(r.starts - 1 for r in ran),
        "early": sum(1 for r in ran if r.first_start < r.action_time),
        "skip_errors": sum(1 for r in rows if r.status == Status.DEAD
                           or (r.status == Status.CANCELLED and not rightly_skipped(r))),
        "run_over_policy": sum(1 for r in ran if policy and r.biz_type == SKIPPABLE
                               and r.first_start - r.action_time > max_lateness),
        "recovery_s": recovery,
        "back_s": since_restart(at for _, at in reached),
        "drain_s": round((max(backlog_done) - restarted).total_seconds(), 2) if backlog_done else None,
        "stream_late": sum(1 for _, late in stream if late is None or late > on_time),
        "stream_p99_after_ms": stats.rnd(stats.pct(after, 99)),
    }


def ratios(runs) -> dict:
    """Per repeat: the outage without the policy against with it (how many times longer)."""
    return ratios_of(runs, [("late_recovery", "no_policy", "policy", metric) for metric in ("recovery_s", "drain_s")])


def targets(summary, ratio_table) -> list:
    def worst(metrics):
        values = [summary.get("late_recovery", {}).get(v, {}).get(m) for v in VARIANTS for m in metrics]
        return None if any(v is None for v in values) else sum(v["max"] for v in values)

    return [
        ("late_recovery", "late_recovery: on time again after the outage, without the policy / with it >= 2",
         median_ratio(ratio_table, "late_recovery", "no_policy/policy", "recovery_s"), lambda v: v >= 2),
        ("late_recovery", "late_recovery: lost + run twice + early = 0 (every run, both variants)",
         worst(("missing", "duplicates", "early")), lambda v: v == 0),
        ("late_recovery", "late_recovery: every skipped task CANCELLED by the policy with its last_error, none "
         "run over it (every run, both variants)", worst(("skip_errors", "run_over_policy")), lambda v: v == 0),
    ]
