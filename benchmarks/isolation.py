"""Business isolation: one biz_type's backlog against another's due tasks, a rate limit, and what
fair claiming costs a deployment with one biz_type and no limits.

- isolation_neighbour: N_BACKLOG tasks of `benchmarks.noop` already due, then N_SPREAD of
  `benchmarks.neighbour` spread over the window while the backlog drains. Three runs side by
  side: the spread alone, the backlog alone, both. The spread's lateness with the backlog against
  without it; the backlog's drain rate with the spread against alone.
- isolation_rate: N tasks of `benchmarks.limited` (rate_limit=LIMITED_RATE) due at the same
  instant: how long their starts take, and the most starts in any one second.
- isolation_cost: the claim statement alone (`claim_due`), as the working tree has it and as the
  last commit with a different one had it, each claiming the same backlog of one biz_type with
  no limits, in batches of SCAN_BATCH_SIZE; alternated, CLAIM_ROUNDS each per repeat.
"""

import re
import subprocess
import time
from datetime import timedelta

from timeouts.states import Status

from . import stats
from .database import BenchError, reset
from .handlers import LIMITED, LIMITED_RATE, NEIGHBOUR, NOOP
from .pairs import median_ratio, ratios_of
from .processes import Processes, flush_broker
from .workload import (
    db_now,
    due_times,
    probe_path,
    schedule_bulk,
    schedule_single,
    wait_for_starts,
    warm_worker,
)

SCENARIOS = ("isolation_neighbour", "isolation_rate", "isolation_cost")
VARIANTS = {"isolation_neighbour": ("spread_alone", "backlog_alone", "together"),
            "isolation_rate": ("limited",), "isolation_cost": ("current", "previous")}
LABELS = {"spread_alone": "spread alone", "backlog_alone": "backlog alone", "together": "backlog + spread",
          "limited": f"rate-limited ({LIMITED})", "current": "claim_due, working tree",
          "previous": "claim_due, previous commit"}
CLAIM_ROUNDS = 3  # isolation_cost: claims of the whole backlog per variant and repeat, alternated
PARAM = re.compile(r"%\((\w+)\)s")

STARTS = """
SELECT t.job_id, t.action_time, s.started_at
FROM timeouts_task AS t LEFT JOIN timeouts_bench_start AS s ON s.job_id = t.job_id
WHERE t.biz_type = %s
"""


def run(ctx, scenario, rep) -> dict:
    if scenario == "isolation_cost":
        return _cost(ctx, rep)
    variants = VARIANTS[scenario]
    order = variants if rep % 2 == 0 else tuple(reversed(variants))
    return {variant: _one(ctx, scenario, variant, rep) for variant in order}


def _one(ctx, scenario, variant, rep) -> dict:
    cfg = ctx.cfg
    reset(ctx.conn)
    flush_broker(cfg.broker_url)
    procs = Processes(env=ctx.env, cwd=ctx.cwd, log_dir=ctx.log_dir, label=f"{scenario}/{variant}/rep{rep + 1}")
    try:
        procs.worker(app=cfg.celery_app, concurrency=cfg.concurrency)
        warm_worker(ctx.app, ctx.conn, count=2 * cfg.concurrency, check=procs.check)
        if scenario == "isolation_rate":
            return _rate(ctx, procs)
        return _neighbour(ctx, procs, variant, rep)
    finally:
        procs.stop_all()


def biz_stats(conn, biz_type) -> dict:
    """stats.analyze() of one biz_type's tasks, by their start rows."""
    expected, starts = {}, []
    for job_id, action_time, started_at in conn.execute(STARTS, (biz_type,)):
        expected[job_id] = action_time
        if started_at is not None:
            starts.append((job_id, started_at))
    out = stats.analyze(expected, starts)
    out.pop("first_start", None)
    out.pop("last_start", None)
    return out


def _neighbour(ctx, procs, variant, rep) -> dict:
    cfg = ctx.cfg
    out = {}
    backlog = variant in ("backlog_alone", "together")
    if backlog:
        times = due_times("drain", cfg.n_backlog, base=db_now(ctx.conn) - timedelta(seconds=1))
        schedule_bulk(ctx.alias, times, chunk=cfg.bulk_chunk, biz_type=NOOP)
        ctx.conn.execute("ANALYZE timeouts_task")
    procs.dispatcher(cfg.dispatcher_args)
    if not backlog:  # with a backlog, a probe would measure the wait behind it
        probe_path(ctx.alias, ctx.conn, count=2, check=procs.check, timeout=60)
    n_expected = 0
    if variant != "backlog_alone":
        base = db_now(ctx.conn) + timedelta(seconds=cfg.lead)
        times = due_times("spread", cfg.n_isolation_spread, base=base, window=cfg.window, seed=cfg.seed + rep)
        out.update(schedule_single(ctx.alias, times, biz_type=NEIGHBOUR, label=f"isolation {variant}: schedule()"))
        n_expected += cfg.n_isolation_spread
    if backlog:
        n_expected += cfg.n_backlog
    wait_for_starts(ctx.conn, n_expected, deadline=time.monotonic() + cfg.drain_timeout, check=procs.check,
                    label=f"isolation_neighbour {variant}: started")
    if variant != "backlog_alone":
        out.update(biz_stats(ctx.conn, NEIGHBOUR))
    if backlog:
        drained = biz_stats(ctx.conn, NOOP)
        out.update(backlog_per_s=drained["start_per_s"], backlog_missing=drained["missing"],
                   backlog_duplicates=drained["duplicates"])
        if variant == "backlog_alone":
            out.update(n=drained["n"], started=drained["started"], missing=drained["missing"],
                       duplicates=drained["duplicates"], early=drained["early"])
    return out


def _rate(ctx, procs) -> dict:
    """Every task due at one instant, `lead` seconds ahead. The handler's own limit would be
    declared by a claimer that imports it; the bench's dispatcher does not import the bench's
    handlers, so the same limit is put in force with set_limits()."""
    import timeouts

    cfg = ctx.cfg
    timeouts.set_limits(LIMITED, rate_limit=LIMITED_RATE, using=ctx.alias)
    procs.dispatcher(cfg.dispatcher_args)
    probe_path(ctx.alias, ctx.conn, count=2, check=procs.check, timeout=60)
    at = db_now(ctx.conn) + timedelta(seconds=cfg.lead)
    schedule_bulk(ctx.alias, [at] * cfg.n_rate, chunk=cfg.bulk_chunk, biz_type=LIMITED)
    wait_for_starts(ctx.conn, cfg.n_rate, deadline=time.monotonic() + cfg.drain_timeout, check=procs.check,
                    label="isolation_rate: started")
    out = biz_stats(ctx.conn, LIMITED)
    starts = sorted(at for (at,) in ctx.conn.execute(
        "SELECT s.started_at FROM timeouts_bench_start AS s JOIN timeouts_task AS t ON t.job_id = s.job_id "
        "WHERE t.biz_type = %s", (LIMITED,)))
    out.update(start_span_s=round((starts[-1] - starts[0]).total_seconds(), 2) if len(starts) > 1 else None,
               max_per_1s=max_in_window(starts, timedelta(seconds=1)))
    return out


def max_in_window(times, width) -> int:
    """The most of the sorted `times` that fall in any window [t, t + width)."""
    best, first = 0, 0
    for last, at in enumerate(times):
        while at - times[first] >= width:
            first += 1
        best = max(best, last - first + 1)
    return best


# --- isolation_cost: the claim statement, now and before ---------------------------------------------

CLAIMS_SQL = "timeouts/sql/queries/claims.sql"
CLAIMS_SQL_BEFORE = "timeouts/sql/queries.sql"


def _has(git, commit, path) -> bool:
    return path in git("ls-tree", "-r", "--name-only", commit, "--", path).split()


def claim_sql_before(root, repo=None, commit=None) -> tuple[str, str]:
    """(commit, claim_due) of `commit`, or of the newest commit of the git repository `repo`
    (default: root) whose claim_due differs from root's."""
    from timeouts.store.queries import parse

    path = CLAIMS_SQL
    current = parse((root / path).read_text())["claim_due"]

    def git(*args):
        try:
            return subprocess.run(["git", "-C", str(repo or root), *args], check=True, capture_output=True, text=True,
                                  timeout=60).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            raise BenchError(f"isolation_cost reads the previous claim_due with git (--repo): {exc}") from None

    # The claim lived in sql/queries.sql before the queries were filed by subject: history has both.
    commits = [commit] if commit else git("log", "--format=%H", "--", path, CLAIMS_SQL_BEFORE).split()
    for commit in commits:
        text = git("show", f"{commit}:{path if _has(git, commit, path) else CLAIMS_SQL_BEFORE}")
        query = parse(text).get("claim_due")
        if query and query != current:
            return commit, query
    raise BenchError(f"no commit of {path} has a claim_due other than the working tree's")


def _cost(ctx, rep) -> dict:
    from timeouts import registry
    from timeouts.conf import get_settings, notify_params
    from timeouts.states import substitute
    from timeouts.store.queries import parse

    cfg = ctx.cfg
    reset(ctx.conn)
    commit, previous = claim_sql_before(ctx.cwd, cfg.repo or None, cfg.claim_sql_commit or None)
    current = parse((ctx.cwd / CLAIMS_SQL).read_text())["claim_due"]
    batch = get_settings().SCAN_BATCH_SIZE
    values = {"limit": batch, "lead": 0.0, "max_dispatched": cfg.n_claim + 1, "shard_index": 0, "shard_count": 1,
              "attribute_prefixes": list(registry.attribute_prefixes()), **notify_params()}
    queries = {"current": substitute(current), "previous": substitute(previous)}
    for name, sql in queries.items():
        unknown = sorted(set(PARAM.findall(sql)) - set(values))
        if unknown:
            raise BenchError(f"the {name} claim_due takes parameters the bench does not know: {', '.join(unknown)}")
    times = due_times("drain", cfg.n_claim, base=db_now(ctx.conn) - timedelta(seconds=1))
    schedule_bulk(ctx.alias, times, chunk=cfg.bulk_chunk, biz_type=NOOP)
    ctx.conn.execute("VACUUM ANALYZE timeouts_task")
    rates = {name: [] for name in queries}
    order = list(queries) if rep % 2 == 0 else list(reversed(list(queries)))
    with ctx.db.connect() as conn:
        for _ in range(CLAIM_ROUNDS):
            for name in order:
                rates[name].append(_claim_all(conn, queries[name], values, cfg.n_claim))
                _unclaim(conn)
    return {name: {"n": cfg.n_claim, "claim_per_s": sorted(r)[len(r) // 2], "rounds": r,
                   "previous_commit": commit[:10], "batch": batch} for name, r in rates.items()}


def _claim_all(conn, sql, values, n) -> int:
    claimed = 0
    started = time.perf_counter()
    while claimed < n:
        rows = conn.execute(sql, values, prepare=True).fetchall()
        if not rows:
            raise BenchError(f"claim_due claimed nothing with {n - claimed} tasks left")
        claimed += len(rows)
    return round(claimed / (time.perf_counter() - started))


def _unclaim(conn):
    """Every claimed task back to PENDING, and the table vacuumed: the next round claims the same."""
    conn.execute("UPDATE timeouts_task SET status = %s, dispatched_at = NULL, lease_until = NULL WHERE status = %s",
                 (int(Status.PENDING), int(Status.DISPATCHED)))
    conn.execute("VACUUM ANALYZE timeouts_task")


def ratios(runs) -> dict:
    return ratios_of(runs, [("isolation_neighbour", "together", "spread_alone", "p99_ms"),
                            ("isolation_neighbour", "together", "spread_alone", "p50_ms"),
                            ("isolation_neighbour", "together", "backlog_alone", "backlog_per_s"),
                            ("isolation_cost", "current", "previous", "claim_per_s")])


def targets(summary, ratio_table) -> list:
    def ratio(scenario, pair, metric):
        return median_ratio(ratio_table, scenario, pair, metric)

    def median(scenario, path, metric):
        s = summary.get(scenario, {}).get(path, {}).get(metric)
        return None if s is None else s["median"]

    def worst(scenario, path, metrics, key="max"):
        values = [summary.get(scenario, {}).get(path, {}).get(m) for m in metrics]
        return None if any(v is None for v in values) else sum(v[key] for v in values)

    return [
        ("isolation_neighbour", "isolation_neighbour: spread p99 beside the backlog / alone <= 2",
         ratio("isolation_neighbour", "together/spread_alone", "p99_ms"), lambda v: v <= 2),
        ("isolation_neighbour", "isolation_neighbour: backlog drain rate beside the spread / alone >= 0.8",
         ratio("isolation_neighbour", "together/backlog_alone", "backlog_per_s"), lambda v: v >= 0.8),
        ("isolation_neighbour", "isolation_neighbour, backlog + spread: missing + duplicates + early = 0 (every run)",
         worst("isolation_neighbour", "together", ("missing", "duplicates", "early", "backlog_missing",
                                                   "backlog_duplicates")), lambda v: v == 0),
        ("isolation_rate", "isolation_rate: the starts take >= 9.5 s (median)",
         median("isolation_rate", "limited", "start_span_s"), lambda v: v >= 9.5),
        ("isolation_rate", "isolation_rate: no 1 s window with more than 220 starts (every run)",
         worst("isolation_rate", "limited", ("max_per_1s",)), lambda v: v <= 220),
        ("isolation_rate", "isolation_rate: missing + duplicates + early = 0 (every run)",
         worst("isolation_rate", "limited", ("missing", "duplicates", "early")), lambda v: v == 0),
        ("isolation_cost", "isolation_cost: claims/s, one biz_type, no limits / the previous claim_due's >= 0.95",
         ratio("isolation_cost", "current/previous", "claim_per_s"), lambda v: v >= 0.95),
    ]
