"""Ratios (scan vs dispatcher, dispatcher vs Celery direct, vs peers) and the targets.

Ratios are taken per repeat (the runs of one repeat ran side by side, on the same machine state)
and then summarised by their median [min-max]. Targets are checked on medians, except the
correctness targets (missing, duplicates, early), which must hold in every run.
"""

from .debounce import targets as debounce_targets
from .durable import targets as durable_targets
from .isolation import targets as isolation_targets
from .late_recovery import targets as late_targets
from .pairs import by_rep, paired
from .peers import peer_scenario
from .scale import targets as scale_targets
from .shards import targets as shards_targets
from .tasks_backend import targets as tasks_targets
from .tracing_cost import targets as tracing_targets

LATENESS = ("p50_ms", "p99_ms", "max_ms")
RATES = ("start_per_s", "claim_per_s")


def ratios(runs, peer_runs) -> dict:
    out = {}
    for scenario in ("spread", "burst", "drain", "publish"):
        for a, b in (("scan", "dispatcher"), ("dispatcher", "celery")):
            for metric in LATENESS + RATES:
                s = paired(runs, scenario, a, b, metric)
                if s:
                    out.setdefault(scenario, {}).setdefault(f"{a}/{b}", {})[metric] = s
    for metric in ("p50_ms", "p99_ms", "burst_last_ms"):
        s = paired(runs, "defaults", "defaults", "tuned", metric)
        if s:
            out.setdefault("defaults", {}).setdefault("defaults/tuned", {})[metric] = s
    for scenario, metric in (("idle", "idle_qps"), ("idle", "idle_cpu_pct")):
        s = paired(runs, scenario, "scan", "dispatcher", metric)
        if s:
            out.setdefault(scenario, {}).setdefault("scan/dispatcher", {})[metric] = s
    for scenario, metrics in (("spread", LATENESS), ("burst", LATENESS), ("drain", ("start_per_s",)),
                              ("idle", ("idle_qps", "idle_cpu_pct"))):
        for path in ("dispatcher", "celery"):  # celery direct vs the harness's celery: a calibration
            ours = [r for r in runs if r.get("scenario") == scenario and r.get("path") == path]
            for system in sorted({p["system"] for p in peer_runs if "system" in p}):
                theirs = [p for p in peer_runs if p.get("system") == system and peer_scenario(p) == scenario]
                for metric in metrics:
                    if metric == "idle_qps" and system == "celery":
                        continue  # Redis commands, not queries
                    theirs_metric = "drain_per_s" if metric == "start_per_s" else metric
                    pairs = by_rep(ours, theirs, metric, theirs_metric)
                    if pairs:
                        out.setdefault(scenario, {}).setdefault(f"{path}/peer:{system}", {})[metric] = pairs
    for variant, peer in (("single", "sched_single"), ("bulk", "sched_bulk")):
        ours = [r for r in runs if r.get("scenario") == "schedule" and r.get("path") == variant]
        for system in sorted({p["system"] for p in peer_runs if "system" in p}):
            theirs = [p for p in peer_runs if p.get("system") == system and peer_scenario(p) == peer]
            pairs = by_rep(ours, theirs, "sched_per_s", "schedule_per_s")
            if pairs:
                out.setdefault("schedule", {}).setdefault(f"{variant}/peer:{system}", {})["sched_per_s"] = pairs
    return out


def _median(summary, scenario, path, metric):
    s = summary.get(scenario, {}).get(path, {}).get(metric)
    return None if s is None else s["median"]


def _worst(summary, scenario, path, metrics):
    values = [summary.get(scenario, {}).get(path, {}).get(m) for m in metrics]
    return None if any(v is None for v in values) else sum(v["max"] for v in values)


def targets(summary, ratio_table, scan_interval, scenarios) -> list[dict]:
    """The targets, each with what was measured and whether it holds (None: not measured)."""
    sched = summary.get("schedule", {})
    rows = [
        ("spread", "spread, dispatcher: lateness p50 <= 2 ms (median)",
         _median(summary, "spread", "dispatcher", "p50_ms"), lambda v: v <= 2),
        ("spread", "spread, dispatcher: lateness p99 <= 10 ms (median)",
         _median(summary, "spread", "dispatcher", "p99_ms"), lambda v: v <= 10),
        ("spread", "spread, dispatcher: missing + duplicates + early = 0 (every run)",
         _worst(summary, "spread", "dispatcher", ("missing", "duplicates", "early")), lambda v: v == 0),
        ("spread", "spread: dispatcher lateness p99 / Celery ETA's <= 0.5",
         _ratio(ratio_table, "spread", "dispatcher/celery", "p99_ms"), lambda v: v <= 0.5),
        ("burst", "burst: dispatcher last start / Celery ETA last start <= 0.8",
         _ratio(ratio_table, "burst", "dispatcher/celery", "max_ms"), lambda v: v <= 0.8),
        ("drain", "drain, dispatcher: claimed and published >= 5,000 tasks/s",
         _median(summary, "drain", "dispatcher", "claim_per_s"), lambda v: v >= 5000),
        ("publish", "publish (drain, no worker), dispatcher: claimed and published >= 5,000 tasks/s",
         _median(summary, "publish", "dispatcher", "claim_per_s"), lambda v: v >= 5000),
        ("drain", "drain, dispatcher: handler starts >= 0.8x Celery direct",
         _ratio(ratio_table, "drain", "dispatcher/celery", "start_per_s"), lambda v: v >= 0.8),
        ("idle", "idle, dispatcher: <= 1 query/s", _median(summary, "idle", "dispatcher", "idle_qps"),
         lambda v: v <= 1),
        ("idle", "idle, dispatcher: CPU < 1 %", _median(summary, "idle", "dispatcher", "idle_cpu_pct"),
         lambda v: v < 1),
        ("spread", f"spread, scan only: max lateness <= SCAN_INTERVAL + 1 s = {(scan_interval + 1) * 1000:,.0f} ms",
         _median(summary, "spread", "scan", "max_ms"), lambda v: v <= (scan_interval + 1) * 1000),
    ]
    rows += [
        ("defaults", "defaults: spread p99 outside the burst <= 10 ms (median)",
         _median(summary, "defaults", "defaults", "p99_ms"), lambda v: v <= 10),
        ("defaults", "defaults: spread p99 / tuned spread p99 <= 1.5",
         _ratio(ratio_table, "defaults", "defaults/tuned", "p99_ms"), lambda v: v <= 1.5),
        ("defaults", "defaults: missing + duplicates + early = 0 (every run)",
         _worst(summary, "defaults", "defaults", ("missing", "duplicates", "early")), lambda v: v == 0),
    ]
    # Without NOTIFY, the API's own cost against the raw statement; with it, the wake-up's too.
    for variant, raw, threshold, label in (
            ("bulk", "raw_copy", 0.8, "bulk_schedule() >= 0.8x raw COPY"),
            ("bulk_notify", "raw_copy", 0.5, "bulk_schedule() with NOTIFY >= 0.5x raw COPY"),
            ("single", "raw_insert", 0.85, "schedule() >= 0.85x raw INSERT"),
            ("single_notify", "raw_insert", 0.7, "schedule() with NOTIFY >= 0.7x raw INSERT")):
        rows.append(("schedule", label, _ratio(ratio_table, "schedule", f"{variant}/{raw}", "sched_per_s"),
                     lambda v, t=threshold: v >= t))
    for variant in ("single", "single_notify"):
        value = sched.get(variant, {}).get("sched_per_s")
        label = "schedule() with NOTIFY" if variant.endswith("notify") else "schedule()"
        rows.append(("schedule", f"{label} >= 2,000 tasks/s", value and value["median"], lambda v: v >= 2000))
    rows += durable_targets(summary, ratio_table) + tasks_targets(summary, ratio_table)
    rows += isolation_targets(summary, ratio_table) + shards_targets(summary, ratio_table)
    rows += debounce_targets(summary, ratio_table)
    rows += late_targets(summary, ratio_table) + tracing_targets(summary, ratio_table)
    rows += scale_targets(summary, ratio_table)
    return [{"scenario": scenario, "target": name, "measured": value,
             "ok": None if value is None else bool(check(value))}
            for scenario, name, value, check in rows if scenario in scenarios]


def _ratio(table, scenario, pair, metric):
    s = table.get(scenario, {}).get(pair, {}).get(metric)
    return None if s is None else round(s["median"], 3)


def schedule_ratios(runs) -> dict:
    """schedule variants against the raw baselines of the same repeat."""
    out = {}
    for variant, raw in (("single", "raw_insert"), ("single_keyed", "raw_insert"), ("single_notify", "raw_insert"),
                         ("single_notify", "raw_insert_notify"), ("bulk", "raw_copy"), ("bulk_notify", "raw_copy")):
        s = paired(runs, "schedule", variant, raw, "sched_per_s")
        if s:
            out[f"{variant}/{raw}"] = {"sched_per_s": s}
    return out
