"""Shards (TIMEOUTS["SHARDS"]): the scenarios, their ratios per repeat and their targets.

    shards_drain     claim+publish/s and handler starts/s over 1, 2 and 4 shards, on one server and
                     on separate clusters, and the tasks per CPU-second they cost (shard_load.py)
    shards_outage    three clusters, one stopped: the lateness of the others' tasks (shard_load.py)
    shards_idle      one idle dispatcher on 1, 2 and 4 shards: queries/s and CPU (shard_costs.py)
    shards_overhead  one shard, the working tree against the code before shards (shard_costs.py)
    shards_rate      one biz_type's rate limit over three shards, its tasks spread or on one shard
                     (shard_limits.py)

The machine's cores cap the total throughput: with the dispatcher, the worker and PostgreSQL on
the same two cores, more shards cannot give more tasks per second, so tasks per CPU-second (over
the dispatcher's, the worker's and the PostgreSQL backends' CPU time) say what a shard costs.
"""

from . import shard_costs, shard_limits, shard_load
from .handlers import LIMITED_RATE
from .pairs import median_ratio, ratios_of

SCENARIOS = ("shards_drain", "shards_outage", "shards_idle", "shards_overhead", "shards_rate")
COUNTS = shard_load.COUNTS
DRAIN_VARIANTS = tuple(f"{where}_{k}" for where in ("server", "clusters") for k in COUNTS)
BASELINE = "server_1"  # shards_drain: one shard on the bench's server, as deployed today

LABELS = {
    **{f"server_{k}": f"{k} shard{'s' if k > 1 else ''}, one server" for k in COUNTS},
    **{f"clusters_{k}": f"{k} shard{'s' if k > 1 else ''}, {k} separate cluster{'s' if k > 1 else ''}"
       for k in COUNTS},
    "all_up": "3 clusters up", "one_stopped": "1 of 3 clusters stopped",
    **{f"shards_{k}": f"{k} shard{'s' if k > 1 else ''}" for k in COUNTS},
    "sharded": "working tree, SHARDS=['default']", "before_shards": "the commit before shards",
    "even": "spread over the 3 shards", "skewed": "all on one of the 3 shards",
}
METRICS = {
    "shards_drain": ("claim_per_s", "publish_per_cpu_s", "publish_cpu_s", "start_per_s", "drain_per_cpu_s",
                     "drain_cpu_s", "drain_dispatcher_cpu_s", "drain_worker_cpu_s", "drain_postgres_cpu_s",
                     "drain_cpu_pct", "missing", "duplicates", "early", "cpu_steal_pct"),
    "shards_outage": ("p50_ms", "p90_ms", "p99_ms", "max_ms", "all_p99_ms", "n", "missing", "duplicates", "early",
                      "cpu_steal_pct"),
    "shards_idle": ("idle_qps", "per_shard_qps", "idle_cpu_pct", "per_shard_cpu_pct", "idle_round_trips_per_s",
                    "idle_xacts_per_s", "rss_mb", "cpu_steal_pct"),
    "shards_overhead": ("claim_per_s", "start_per_s", "missing", "duplicates", "early", "cpu_steal_pct"),
    "shards_rate": ("start_span_s", "start_per_s", "max_per_1s", "n", "missing", "duplicates", "early",
                    "cpu_steal_pct"),
}
HEADERS = {
    "shards_drain": ["claim+publish/s", "tasks/CPU-s", "CPU s", "starts/s", "tasks/CPU-s", "CPU s",
                     "dispatcher CPU s", "worker CPU s", "PostgreSQL CPU s", "CPU %", "missing", "dup", "early",
                     "steal %"],
    "shards_outage": ["p50 ms", "p90 ms", "p99 ms", "max ms", "all shards p99 ms", "tasks counted", "missing", "dup",
                      "early", "steal %"],
    "shards_idle": ["queries/s", "per shard", "CPU %", "per shard", "round trips/s", "xacts/s", "RSS MB", "steal %"],
    "shards_overhead": ["claim+publish/s", "starts/s", "missing", "dup", "early", "steal %"],
    "shards_rate": ["starts span s", "starts/s", "most in 1 s", "tasks", "missing", "dup", "early", "steal %"],
}
TITLES = {
    "shards_drain": ("{n_shards_drain:,} tasks due at once over the shards: without a worker (claim+publish/s, its "
                     "tasks/CPU-s and CPU s: dispatcher + PostgreSQL), then with one (starts/s, tasks/CPU-s, "
                     "CPU s: dispatcher + worker + PostgreSQL; CPU %: of one core, over the drain)"),
    "shards_outage": ("{n_shards_outage:,} tasks due over {window:.0f} s on 3 clusters: lateness of the tasks of "
                      "the two clusters that stay up (ms)"),
    "shards_idle": "Idle dispatcher on 1, 2 and 4 shards ({n_idle:,} tasks due in 1 h, {idle_seconds:.0f} s window)",
    "shards_overhead": ("publish and drain of {n_drain:,} tasks on one database: the working tree against the "
                        "code before shards (commit in the JSON)"),
    "shards_rate": ("{n_rate:,} tasks of a biz_type with rate_limit=" + str(LIMITED_RATE) + " due at once, over 3 "
                    "shards (one server): the starts of all the shards together"),
}

def run(ctx, scenario, rep) -> dict:
    return {"shards_drain": shard_load.drain, "shards_outage": shard_load.outage, "shards_idle": shard_costs.idle_cost,
            "shards_overhead": shard_costs.overhead, "shards_rate": shard_limits.rate}[scenario](ctx, rep)


def ratios(runs) -> dict:
    """a/b per repeat: each shards_drain variant against one shard on one server; a stopped cluster
    against all up; 2 and 4 shards' idle cost per shard against one's; the working tree against
    the code before shards."""
    pairs = [("shards_drain", variant, BASELINE, metric) for variant in DRAIN_VARIANTS if variant != BASELINE
             for metric in ("claim_per_s", "publish_per_cpu_s", "start_per_s", "drain_per_cpu_s")]
    pairs += [("shards_outage", "one_stopped", "all_up", metric) for metric in ("p50_ms", "p99_ms")]
    pairs += [("shards_idle", f"shards_{k}", "shards_1", metric) for k in COUNTS[1:]
              for metric in ("per_shard_qps", "per_shard_cpu_pct")]
    pairs += [("shards_overhead", "sharded", "before_shards", metric) for metric in ("claim_per_s", "start_per_s")]
    return ratios_of(runs, pairs)


def targets(summary, ratio_table) -> list:
    def ratio(scenario, pair, metric):
        return median_ratio(ratio_table, scenario, pair, metric)

    def worst(scenario, variants, metrics, key="max", combine=sum):
        values = [summary.get(scenario, {}).get(v, {}).get(m) for v in variants for m in metrics]
        return None if any(v is None for v in values) else combine(v[key] for v in values)

    def median(scenario, variant, metric):
        value = summary.get(scenario, {}).get(variant, {}).get(metric)
        return None if value is None else value["median"]

    top = max(COUNTS)
    correct = ("missing", "duplicates", "early")
    return [
        ("shards_drain", "shards_drain: missing + duplicates + early = 0 (every run, every variant)",
         worst("shards_drain", DRAIN_VARIANTS, correct), lambda v: v == 0),
        ("shards_overhead", "shards_overhead: claim+publish/s, one shard / before shards >= 0.95",
         ratio("shards_overhead", "sharded/before_shards", "claim_per_s"), lambda v: v >= 0.95),
        ("shards_overhead", "shards_overhead: handler starts/s, one shard / before shards >= 0.95",
         ratio("shards_overhead", "sharded/before_shards", "start_per_s"), lambda v: v >= 0.95),
        ("shards_outage", "shards_outage: live shards' p99, one cluster stopped / all up <= 1.5",
         ratio("shards_outage", "one_stopped/all_up", "p99_ms"), lambda v: v <= 1.5),
        ("shards_outage", "shards_outage: live shards' missing + duplicates + early = 0 (every run)",
         worst("shards_outage", ("all_up", "one_stopped"), correct), lambda v: v == 0),
        ("shards_idle", f"shards_idle: queries/s per shard, {top} shards / 1 shard <= 1.5",
         ratio("shards_idle", f"shards_{top}/shards_1", "per_shard_qps"), lambda v: v <= 1.5),
        ("shards_idle", f"shards_idle: CPU per shard, {top} shards / 1 shard <= 1.5",
         ratio("shards_idle", f"shards_{top}/shards_1", "per_shard_cpu_pct"), lambda v: v <= 1.5),
        ("shards_rate", f"shards_rate: no 1 s window with more than {1.1 * LIMITED_RATE:.0f} starts on all the shards "
         "together (every run, both variants)",
         worst("shards_rate", shard_limits.VARIANTS, ("max_per_1s",), combine=max), lambda v: v <= 1.1 * LIMITED_RATE),
        ("shards_rate", "shards_rate: spread over the shards, the starts take >= 9.5 s (median)",
         median("shards_rate", "even", "start_span_s"), lambda v: v >= 9.5),
        ("shards_rate", f"shards_rate: all on one shard, >= {0.6 * LIMITED_RATE:.0f} starts/s (the parts follow the "
         "tasks; median)", median("shards_rate", "skewed", "start_per_s"), lambda v: v >= 0.6 * LIMITED_RATE),
        ("shards_rate", "shards_rate: missing + duplicates + early = 0 (every run)",
         worst("shards_rate", shard_limits.VARIANTS, correct), lambda v: v == 0),
    ]
