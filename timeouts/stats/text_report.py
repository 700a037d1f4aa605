"""The report of `manage.py timeouts_stats` as text: one database's (database_report.py), or the totals
and the per-shard table of several (shard_totals.report_of_shards())."""

from datetime import datetime

from timeouts.states import Status
from timeouts.stats import shard_totals
from timeouts.stats.counting import Count
from timeouts.stats.per_biz_type import OVERDUE_LIMIT
from timeouts.stats.units import human_bytes, seconds


def format_report(data) -> str:
    lines = []
    if "shards" in data:
        lines.extend(_shards_heading(data))
    lines.append(f"Tasks by status and biz_type ({data['counts']['how']}):")
    rows = data["counts"]["rows"]
    totals = {}
    for row in rows:
        totals[row["status"]] = totals.get(row["status"], 0) + row["count"]
    width = max([len(r["biz_type"]) for r in rows] + [8])
    for row in rows:
        shown = str(Count(row["count"], row["exact"]))
        lines.append(f"  {row['status']:<10} {row['biz_type']:<{width}} {shown:>14}")
    if not rows:
        lines.append("  (no tasks)")
    lines.append("  totals: " + (", ".join(f"{status} {n:,}" for status, n in sorted(totals.items())) or "none"))
    oldest = data["oldest_overdue"]
    lines.append("")
    if oldest:
        shard = f" on shard {oldest['shard']}" if "shard" in oldest else ""
        lines.append(f"Oldest overdue task: job {oldest['job_id']} {oldest['biz_type']}:{oldest['biz_id']}{shard}, "
                     f"due since {oldest['run_at'].isoformat()} ({seconds(oldest['age_seconds'])}), "
                     f"attempts {oldest['attempts']}")
    else:
        lines.append("Oldest overdue task: none (nothing is waiting past its time)")
    default = data["default_partition"]
    lines.append(f"Rows in the DEFAULT partition: {Count(default['rows'], default['exact'])}"
                 + ("  (maintenance moves them out when it creates their partition)" if default["rows"] else ""))
    late = data["lateness"]
    lines.append("")
    lines.append(f"Lateness of tasks due in the last {late['minutes']} min (first attempts, started_at - action_time): "
                 f"{late['started']} started, {late['waiting']} still waiting, {late['due']} due (cancelled left out)")
    lines.append(f"  p50 {seconds(late['p50'])}   p90 {seconds(late['p90'])}   p99 {seconds(late['p99'])}   "
                 f"max {seconds(late['max'])}"
                 + ("" if late.get("percentiles_exact", True)
                    else f"  (merged from each shard's {shard_totals.LATENESS_POINTS:,} quantiles: "
                         "within about 0.1% of rank)"))
    lines.append("")
    lines.extend(_biz_type_lines(data["biz_types"]))
    lines.append("")
    if "shards" in data:
        lines.extend(_shard_lines(data["shards"]))
    else:
        lines.extend(_partition_lines(data["partitions"]))
    return "\n".join(lines) + "\n"


def _partition_lines(found):
    lines = ["Partitions (estimated rows from the statistics; size with indexes):"]
    for p in found:
        span = "DEFAULT" if p["default"] else f"{_short(p['lower'], 'MINVALUE')} .. {_short(p['upper'], 'MAXVALUE')}"
        rows_text = "?" if p["estimated_rows"] is None else f"~{p['estimated_rows']:,}"
        lines.append(f"  {p['name']:<26} {span:<45} {rows_text:>12} {human_bytes(p['bytes']):>10}")
    return lines


def _shards_heading(data):
    shards, unread = list(data["shards"]), shard_totals.unread_shards(data)
    heading = f"Shards: {', '.join(shards)}."
    if unread:
        heading += f" The totals below leave out {', '.join(unread)}: could not be read."
    return [heading, ""]


def _shard_lines(reports):
    """One line per shard: its own tasks, overdue tasks, oldest overdue, lateness and partitions."""
    width = max([len(alias) for alias in reports] + [5])
    lines = ["Per shard (--database ALIAS: one shard's full report, with its partitions):",
             f"  {'shard':<{width}} {'tasks':>12} {'pending':>12} {'overdue':>10} {'running':>8} {'dead':>8} "
             f"{'oldest overdue':>15} {'p99 late':>10} {'DEFAULT rows':>13}  partitions"]
    for alias, data in reports.items():
        if "error" in data:
            lines.append(f"  {alias:<{width}} cannot be read: {data['error']}")
            continue
        by_status = {}
        for row in data["counts"]["rows"]:
            by_status[row["status"]] = by_status.get(row["status"], Count(0, True)) + Count(row["count"], row["exact"])
        tasks = sum(by_status.values(), Count(0, True))
        overdue = sum((Count(b["overdue"], b["overdue_exact"]) for b in data["biz_types"]), Count(0, True))
        oldest = data["oldest_overdue"]
        default = Count(data["default_partition"]["rows"], data["default_partition"]["exact"])
        size = human_bytes(sum(p["bytes"] or 0 for p in data["partitions"]))
        status = {label: str(by_status.get(label, Count(0, True))) for label in
                  (Status.PENDING.label, Status.RUNNING.label, Status.DEAD.label)}
        lines.append(f"  {alias:<{width}} {str(tasks):>12} {status[Status.PENDING.label]:>12} {str(overdue):>10} "
                     f"{status[Status.RUNNING.label]:>8} {status[Status.DEAD.label]:>8} "
                     f"{seconds(oldest and oldest['age_seconds']):>15} {seconds(data['lateness']['p99']):>10} "
                     f"{str(default):>13}  {len(data['partitions'])}, {size}")
    return lines


def _biz_type_lines(rows):
    lines = [f"Biz types: limits in force, pause, running tasks, overdue tasks (exact up to {OVERDUE_LIMIT:,}, "
             "then estimated):"]
    width = max([len(r["biz_type"]) for r in rows] + [8])
    for r in rows:
        rate = "none" if r["rate_limit"] is None else f"{r['rate_limit']:.15g}/s"
        concurrency = "none" if r["concurrency"] is None else str(r["concurrency"])
        overdue = str(Count(r["overdue"], r["overdue_exact"]))
        running = str(Count(r["running"], r["running_exact"]))
        line = (f"  {r['biz_type']:<{width}} {'paused' if r['paused'] else 'running':<7}  rate_limit {rate:<9} "
                f"concurrency {concurrency:<6} running {running:>6} overdue {overdue:>9}")
        if r["overridden"]:
            own = ("none" if r["handler_rate_limit"] is None else f"{r['handler_rate_limit']:.15g}/s",
                   "none" if r["handler_concurrency"] is None else str(r["handler_concurrency"]))
            line += f"  (set_limits(); the handler's: rate_limit {own[0]}, concurrency {own[1]})"
        if r.get("rate_part") is not None or r.get("concurrency_part") is not None:
            part = [f"rate_limit {r['rate_part']:.4g}/s" if r.get("rate_part") is not None else None,
                    f"concurrency {r['concurrency_part']}" if r.get("concurrency_part") is not None else None]
            line += f"  (this shard's part: {', '.join(p for p in part if p)})"
        if r.get("limits_differ_on"):
            line += f"  (other limits on {', '.join(r['limits_differ_on'])}: see --database ALIAS)"
        lines.append(line)
    if not rows:
        lines.append("  (none: no handler, no task waiting, no limits stored)")
    return lines


def _short(iso, missing):
    """'2026-11-21T00:00:00+00:00' -> '2026-11-21 00:00 UTC'."""
    if iso is None:
        return missing
    moment = datetime.fromisoformat(iso)
    return f"{moment:%Y-%m-%d %H:%M} {moment.tzname() or ''}".strip()
