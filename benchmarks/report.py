"""The results: medians [min-max] per scenario and path, printed as tables and written as JSON."""

import json
from pathlib import Path

from . import debounce, late_recovery, scale, shards, tracing_cost
from .config import PATH_LABELS
from .durable import LABELS
from .isolation import LABELS as ISOLATION_LABELS
from .peers import peer_scenario
from .stats import summarize
from .tasks_backend import LABELS as TASKS_LABELS

# the variants of the scenarios that compare two ways (or more)
DURABLE_LABELS = {**LABELS, **TASKS_LABELS, **ISOLATION_LABELS, **shards.LABELS, **debounce.LABELS,
                  **late_recovery.LABELS, **tracing_cost.LABELS, **scale.LABELS}

TIMED_METRICS = ("p50_ms", "p90_ms", "p99_ms", "max_ms", "missing", "duplicates", "early",
                 "sched_per_s", "sched_overrun", "claim_per_s", "start_per_s", "drain_total_s", "cpu_steal_pct")
IDLE_METRICS = ("idle_qps", "idle_round_trips_per_s", "idle_xacts_per_s", "idle_cpu_pct", "rss_mb")
SCHEDULE_METRICS = ("sched_per_s", "notifications", "cpu_steal_pct")
DEFAULTS_METRICS = ("p50_ms", "p99_ms", "burst_last_ms", "spread_counted", "missing", "duplicates", "early",
                    "cpu_steal_pct")
DEFAULTS_LABELS = {"tuned": "tuned (CONN_MAX_AGE, CELERY_DB_REUSE_MAX, prepared)",
                   "defaults": "Django's and Celery's defaults + setup(app)"}
DURABLE_METRICS = {
    "durable_spread": ("p50_ms", "p90_ms", "p99_ms", "max_ms", "missing", "duplicates", "early", "sched_per_s",
                       "cpu_steal_pct"),
    "durable_memory": ("rss_mb", "dispatcher_rss_mb", "stored", "sched_per_s", "cpu_steal_pct"),
    "durable_restart": ("missing", "waiting", "duplicates", "duplicates_at_kill", "twice_started_before_kill_ms",
                        "duplicates_other", "early", "late", "late_in_outage", "late_outside_outage",
                        "late_outside_catch_up", "due_in_outage", "outage_s", "catch_up_per_s", "p50_ms", "p99_ms",
                        "max_ms", "cpu_steal_pct"),
    "durable_cost": ("sched_per_s", "cpu_steal_pct"),
    "durable_cpu": ("total_ms", "caller_ms", "worker_main_ms", "worker_pool_ms", "dispatcher_ms", "postgres_ms",
                    "broker_ms", "postgres_other_ms", "wall_s", "missing", "duplicates", "loadavg_1min",
                    "cpu_steal_pct"),
    "tasks_spread": ("p50_ms", "p90_ms", "p99_ms", "max_ms", "missing", "duplicates", "early", "sched_per_s",
                     "cpu_steal_pct"),
    "tasks_drain": ("start_per_s", "drain_total_s", "missing", "duplicates", "sched_per_s", "cpu_steal_pct"),
    "tasks_enqueue": ("sched_per_s", "cpu_steal_pct"),
    "isolation_neighbour": ("p50_ms", "p90_ms", "p99_ms", "max_ms", "missing", "duplicates", "early", "backlog_per_s",
                            "backlog_missing", "backlog_duplicates", "cpu_steal_pct"),
    "isolation_rate": ("start_span_s", "max_per_1s", "p50_ms", "max_ms", "missing", "duplicates", "early",
                       "cpu_steal_pct"),
    "isolation_cost": ("claim_per_s", "cpu_steal_pct"),
    **shards.METRICS,
    "debounce": debounce.METRICS,
    **late_recovery.METRICS,
    **tracing_cost.METRICS,
    **scale.METRICS,
}
DURABLE_HEADERS = {
    "durable_spread": ["p50 ms", "p90 ms", "p99 ms", "max ms", "missing", "dup", "early", "calls/s", "steal %"],
    "durable_memory": ["worker RSS MB", "dispatcher RSS MB", "rows", "calls/s", "steal %"],
    "durable_restart": ["not started", "of them still to run", "dup", "of them running at the kill",
                        "their first start before it, ms", "other dup", "early",
                        "late > 1 s", "of them due in the outage", "late outside it",
                        "late outside it and its catch-up", "due in the outage", "outage s", "catch-up calls/s",
                        "p50 ms", "p99 ms", "max ms", "steal %"],
    "durable_cost": ["apply_async(countdown=3600)/s", "steal %"],
    "durable_cpu": ["total", "caller", "worker main", "worker pool", "dispatcher", "PostgreSQL", "broker (shared)",
                    "PostgreSQL other (shared)", "run s", "missing", "dup", "load 1 min", "steal %"],
    "tasks_spread": ["p50 ms", "p90 ms", "p99 ms", "max ms", "missing", "dup", "early", "enqueue/s", "steal %"],
    "tasks_drain": ["starts/s", "drain s", "missing", "dup", "enqueue/s", "steal %"],
    "tasks_enqueue": ["enqueue()/s", "steal %"],
    "isolation_neighbour": ["spread p50 ms", "p90 ms", "p99 ms", "max ms", "missing", "dup", "early",
                            "backlog starts/s", "backlog missing", "backlog dup", "steal %"],
    "isolation_rate": ["starts over s", "most in 1 s", "p50 ms", "max ms", "missing", "dup", "early", "steal %"],
    "isolation_cost": ["claimed/s", "steal %"],
    **shards.HEADERS,
    "debounce": debounce.HEADERS,
    **late_recovery.HEADERS,
    **tracing_cost.HEADERS,
    **scale.HEADERS,
}
DURABLE_TITLES = {
    "durable_spread": "{n_durable_spread:,} calls due over {window:.0f} s, one worker (lateness in ms)",
    "durable_memory": "{n_durable_memory:,} calls due in an hour: the worker's RSS, main and pool processes",
    "durable_restart": ("{n_durable_restart:,} calls due {restart_from:.0f}-{restart_to:.0f} s ahead; every worker "
                        "process killed -9 at {restart_kill_at:.0f} s, a new worker {restart_down:.0f} s later"),
    "durable_cost": "{n_durable_cost:,} apply_async(countdown=3600) calls, no worker",
    "durable_cpu": ("{n_durable_cpu:,} calls of one body at {cpu_rate:g}/s (0: as fast as they go), one worker: CPU "
                    "ms per call (user + system) of each group of processes, less its idle rate; total: the "
                    "caller, the worker, the dispatcher and the PostgreSQL sessions"),
    "tasks_spread": "{n_tasks_spread:,} Django tasks with run_after over {window:.0f} s, through TimeoutsBackend",
    "tasks_drain": "{n_tasks_drain:,} Django tasks ready to run, then the dispatcher starts",
    "tasks_enqueue": "{n_tasks_enqueue:,} enqueue() calls due in an hour, no worker",
    "isolation_neighbour": ("{n_backlog:,} tasks of one biz_type already due, {n_isolation_spread:,} of another "
                            "due over {window:.0f} s (lateness of the latter, ms)"),
    "isolation_rate": "{n_rate:,} tasks due at one instant, rate_limit=200",
    "isolation_cost": "claim_due alone over {n_claim:,} due tasks of one biz_type, no limits (median of rounds)",
    **shards.TITLES,
    "debounce": debounce.TITLE,
    **late_recovery.TITLES,
    **tracing_cost.TITLES,
    **scale.TITLES,
}
# More tables of one scenario's runs, after its own: (scenario, title, headers, metrics).
MORE_TABLES = (
    ("durable_cpu", "durable_cpu: the PostgreSQL sessions' CPU ms per call, by the process each serves (idle included)",
     ["caller", "worker main", "worker pool", "dispatcher", "other"],
     ("postgres_for_caller_ms", "postgres_for_worker_main_ms", "postgres_for_worker_pool_ms",
      "postgres_for_dispatcher_ms", "postgres_for_other_ms")),
    *scale.MORE_TABLES,
)
PEER_METRICS = ("p50_ms", "p90_ms", "p99_ms", "max_ms", "missing", "duplicates", "schedule_per_s", "drain_per_s",
                "idle_qps", "idle_cpu_pct")
SCHEDULE_LABELS = {"raw_insert": "raw single-row INSERT", "single": "schedule(), due in 1 h (no NOTIFY)",
                   "single_keyed": 'schedule(), default on_conflict="error", due in 1 h',
                   "single_notify": "schedule(), due in seconds (NOTIFY)",
                   "raw_insert_notify": "raw single-row INSERT + NOTIFY", "raw_copy": "raw COPY",
                   "bulk": "bulk_schedule(), due in 1 h (no NOTIFY)", "bulk_notify": "bulk_schedule(), due in seconds"}


def aggregate(runs) -> dict:
    """{scenario: {path: {metric: {median, min, max, runs}}}}"""
    groups = {}
    for r in runs:
        if "error" not in r:
            groups.setdefault(r["scenario"], {}).setdefault(r["path"], []).append(r)
    out = {}
    for scenario, paths in groups.items():
        metrics = {"idle": IDLE_METRICS, "schedule": SCHEDULE_METRICS, "defaults": DEFAULTS_METRICS,
                   **DURABLE_METRICS}.get(scenario, TIMED_METRICS)
        metrics += tuple(m for sc, _, _, more in MORE_TABLES if sc == scenario for m in more)
        for path, rs in paths.items():
            cells = {m: summarize([r.get(m) for r in rs]) for m in metrics}
            out.setdefault(scenario, {})[path] = {m: s for m, s in cells.items() if s is not None}
    return out


def aggregate_peers(peer_runs) -> dict:
    groups = {}
    for p in peer_runs:
        if "system" in p:
            groups.setdefault(peer_scenario(p), {}).setdefault(p["system"], []).append(p)
    return {sc: {system: {m: s for m in PEER_METRICS if (s := summarize([r.get(m) for r in rs]))}
                 for system, rs in systems.items()} for sc, systems in groups.items()}


def fmt(value):
    if value is None:
        return "-"
    if isinstance(value, int) or value.is_integer():
        return f"{value:,.0f}"
    if abs(value) < 0.1:
        return f"{value:.2g}"
    if abs(value) < 10:
        return f"{value:.2f}"
    if abs(value) < 100:
        return f"{value:.1f}"
    return f"{value:,.0f}"


def cell(summary, metric):
    s = summary.get(metric)
    if s is None:
        return "-"
    if s["runs"] == 1 or s["min"] == s["max"]:
        return fmt(s["median"])
    return f"{fmt(s['median'])} [{fmt(s['min'])}-{fmt(s['max'])}]"


def sections(result) -> list[tuple[str, list, list]]:
    """(title, headers, rows) of every table, for the text and the markdown renderings."""
    s, cfg, out = result["summary"], result["config"], []
    timed = [(sc, p) for sc in ("spread", "burst", "drain", "publish") for p in ("scan", "dispatcher", "celery")
             if p in s.get(sc, {})]
    if timed:
        out.append(("Lateness (started_at - action_time, database clock, ms) and throughput (tasks/s)",
                    ["scenario", "path", "p50", "p90", "p99", "max", "missing", "dup", "early", "sched/s",
                     "sched late", "claim+publish/s", "start/s", "drain s", "steal %"],
                    [[sc, PATH_LABELS[p], *[cell(s[sc][p], m) for m in TIMED_METRICS]] for sc, p in timed]))
    if "schedule" in s:
        out.append(("Schedule throughput (tasks/s)", ["variant", "tasks/s", "NOTIFYs seen", "steal %"],
                    [[SCHEDULE_LABELS.get(v, v), *[cell(s["schedule"][v], m) for m in SCHEDULE_METRICS]]
                     for v in SCHEDULE_LABELS if v in s["schedule"]]))
    if "defaults" in s:
        out.append(("A new host project against a tuned one: 1,000 tasks spread over the window + 300 due at once "
                    "(ms; spread: tasks due outside the burst's first second)",
                    ["settings", "spread p50", "spread p99", "burst last", "spread tasks", "missing", "dup", "early",
                     "steal %"],
                    [[DEFAULTS_LABELS[v], *[cell(s["defaults"][v], m) for m in DEFAULTS_METRICS]]
                     for v in DEFAULTS_LABELS if v in s["defaults"]]))
    for scenario, metrics in DURABLE_METRICS.items():
        if scenario in s:
            title = f"{scenario}: {DURABLE_TITLES[scenario].format(**cfg)}"
            out.append((title, ["variant", *DURABLE_HEADERS[scenario]],
                        [[DURABLE_LABELS.get(v, v), *[cell(s[scenario][v], m) for m in metrics]]
                         for v in DURABLE_LABELS if v in s[scenario]]))
    for scenario, title, headers, metrics in MORE_TABLES:
        if scenario in s:
            rows = [[DURABLE_LABELS.get(v, v), *[cell(s[scenario][v], m) for m in metrics]]
                    for v in DURABLE_LABELS if v in s[scenario] and any(m in s[scenario][v] for m in metrics)]
            out.append((title, ["variant", *headers], rows))
    if "idle" in s:
        out.append((f"Idle cost ({cfg['n_idle']:,} tasks due in 1 h, {cfg['idle_seconds']:.0f} s window)",
                    ["path", "queries/s", "round trips/s", "xacts/s", "CPU %", "RSS MB"],
                    [[PATH_LABELS[p], *[cell(s["idle"][p], m) for m in IDLE_METRICS]] for p in s["idle"]]))
    if result.get("peers_summary"):
        out.append(("Peers (the shared harness, run between the bench's own runs)",
                    ["scenario", "system", "p50 ms", "p90 ms", "p99 ms", "max ms", "missing", "dup", "sched/s",
                     "drain/s", "idle q/s", "idle CPU %"],
                    [[sc, system, *[cell(m, k) for k in PEER_METRICS]]
                     for sc, systems in result["peers_summary"].items() for system, m in systems.items()]))
    if result["ratios"]:
        out.append(("Ratios a/b, taken per repeat", ["scenario", "a/b", "metric", "ratio"],
                    [[sc, pair, metric, cell({"x": v}, "x")] for sc, pairs in result["ratios"].items()
                     for pair, metrics in pairs.items() for metric, v in metrics.items()]))
    out.append(("Targets", ["result", "target", "measured"],
                [[{True: "PASS", False: "FAIL", None: "n/a"}[t["ok"]], t["target"], fmt(t["measured"])]
                 for t in result["targets"]]))
    return out


def _header(result) -> list[str]:
    m, cfg = result["machine"], result["config"]
    code = result.get("code") or {}
    return [(f"timeouts_bench {result['started_at']}: {cfg['repeat']} repeat(s); cells are median [min-max]; "
             f"code {str(code.get('commit'))[:10]}{' + uncommitted changes' if code.get('modified') else ''}"),
            (f"machine: {m['nproc']} CPUs ({m['cpu_model']}), {m['ram_gb']} GB RAM, load average "
             f"{m['loadavg_start']} at start, {result.get('loadavg_end')} at end; PostgreSQL "
             f"{m['postgresql']['server_version']}, Redis {m['redis']}, Python {m['python']}, Celery {m['celery']}, "
             f"psycopg {m['psycopg']}"),
            ("steal %: the share of the CPUs' time the hypervisor gave to other guests during the run "
             "(/proc/stat); runs with much of it measure the host's neighbours as much as the code")]


def _text_table(headers, rows) -> list[str]:
    widths = [max(len(str(x)) for x in col) for col in zip(headers, *rows, strict=True)]

    def line(cols):
        cells = enumerate(zip(cols, widths, strict=True))
        return "  ".join(str(c).ljust(w) if i < 2 else str(c).rjust(w) for i, (c, w) in cells)

    return [line(headers), line(["-" * w for w in widths]), *[line(r) for r in rows]]


def render(result) -> str:
    out = [*_header(result), ""]
    for title, headers, rows in sections(result):
        out += [title, *_text_table(headers, rows), ""]
    out += [f"note: {note}" for note in result.get("notes", [])]
    return "\n".join(out)


def render_markdown(result) -> str:
    out = [f"Command: `{result['command']}`", "", *[f"{line}  " for line in _header(result)], ""]
    for title, headers, rows in sections(result):
        out += [f"#### {title}", "", "| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
        out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
        out.append("")
    out += [f"- note: {note}" for note in result.get("notes", [])]
    return "\n".join(out) + "\n"


def write_json(result, path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")
