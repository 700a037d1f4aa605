"""shards_rate: one biz_type's rate limit held across three shards (databases on the bench's server).

N tasks of `benchmarks.limited` (rate_limit=LIMITED_RATE, set on every shard) fall due at one
instant, spread over the shards by their keys' hash ("even"), or all on one shard ("skewed"),
served by one dispatcher process (a thread per shard), one worker and the scan loop, which shares
the limit out among the shards after their due tasks. Measured over all the shards together: how
long the starts take, and the most starts in any one-second window. Even parts of the limit hold
the first variant from the start; the second needs the scan to move the parts to the busy shard
(until then it starts a third of the rate).
"""

import time
from datetime import timedelta

from . import stats
from .handlers import LIMITED, LIMITED_RATE
from .isolation import max_in_window
from .processes import Processes, flush_broker
from .progress import Progress
from .shard_load import guarded, keys_on, on_shard, serve, shard_of
from .shard_servers import ShardSet
from .workload import db_now, wait_until

SHARDS = 3
SKEWED_ON = 1  # the one shard of the "skewed" variant
VARIANTS = ("even", "skewed")

STARTS = ("SELECT s.job_id, s.started_at FROM timeouts_bench_start AS s WHERE s.job_id = ANY(%s) "
          "ORDER BY s.started_at")
EXPECTED = "SELECT job_id, action_time FROM timeouts_task WHERE biz_type = %s"


def rate(ctx, rep) -> dict:
    variants = VARIANTS if rep % 2 == 0 else tuple(reversed(VARIANTS))
    with ShardSet(ctx, SHARDS, "server") as shard_set:
        return {variant: guarded(f"shards_rate/{variant}/rep{rep + 1}", _rate_one, ctx, shard_set, variant, rep)
                for variant in variants}


def _keys(variant, n) -> dict[int, list[str]]:
    """The tasks' keys by shard index."""
    if variant == "skewed":
        return {SKEWED_ON: keys_on(SKEWED_ON, SHARDS, n, "skewed-")}
    by_shard = {}
    for key in range(n):
        by_shard.setdefault(shard_of(f"even-{key}", SHARDS), []).append(f"even-{key}")
    return by_shard


def _rate_one(ctx, shard_set, variant, rep) -> dict:
    import timeouts

    cfg = ctx.cfg
    k, n = SHARDS, cfg.n_rate
    shard_set.reset(k)
    for i in range(k):
        shard_set.conns[i].execute("TRUNCATE timeouts_limits")  # no parts or bucket from the last run
        timeouts.set_limits(LIMITED, rate_limit=LIMITED_RATE, using=shard_set.alias(i))
    flush_broker(cfg.broker_url)
    procs = Processes(env=shard_set.env(k), cwd=ctx.cwd, log_dir=ctx.log_dir,
                      label=f"shards_rate/{variant}/rep{rep + 1}")
    try:
        serve(ctx, shard_set, k, procs, scan=True)
        due = db_now(shard_set.conns[0]) + timedelta(seconds=cfg.lead)
        for i, keys in sorted(_keys(variant, n).items()):
            on_shard(shard_set, i).bulk_schedule([{"biz_type": LIMITED, "biz_id": key, "at": due, "on_conflict": None}
                                                    for key in keys])
        expected = {}
        for conn in shard_set.conns[:k]:
            expected.update(conn.execute(EXPECTED, (LIMITED,)).fetchall())
        progress = Progress(f"shards_rate/{variant}: started", n)
        count = "SELECT count(DISTINCT job_id) FROM timeouts_bench_start WHERE job_id = ANY(%s)"

        def all_started():
            started = shard_set.conns[0].execute(count, (list(expected),)).fetchone()[0]
            progress.update(started)
            return started >= n

        wait_until(all_started, cfg.drain_timeout, procs.check, f"{n} rate-limited starts", interval=0.5)
        progress.finish(n)
        time.sleep(1.0)  # a second start of a task has time to show
    finally:
        procs.stop_all()
    starts = shard_set.conns[0].execute(STARTS, (list(expected),)).fetchall()
    out = stats.analyze(expected, starts)
    times = [started_at for _, started_at in starts]
    return {"n": n, "started": out["started"], "missing": out["missing"], "duplicates": out["duplicates"],
            "early": out["early"], "start_span_s": round((times[-1] - times[0]).total_seconds(), 2),
            "max_per_1s": max_in_window(times, timedelta(seconds=1)), "start_per_s": out["start_per_s"]}
