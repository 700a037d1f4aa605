"""`timeouts_stats` over several shards: each shard's report (database_report.py), and totals over the
shards that answered. Counts add up; the lateness percentiles are computed again from every shard's
quantiles (`lateness_points()`), since percentiles of parts do not add up to the whole's."""

import itertools
from datetime import timedelta

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections

from timeouts.states import Status
from timeouts.stats.counting import Count
from timeouts.stats.database_report import report
from timeouts.store.queries import fetch_one

# Quantiles of the lateness each shard sends for the merged percentiles: the merge is exact while a
# shard has at most this many first attempts in the window, and within about 0.1% of rank beyond.
LATENESS_POINTS = 1001
LIMIT_KEYS = ("rate_limit", "concurrency", "paused")  # a biz_type's limits in force, compared across shards


def report_of_shards(aliases, *, exact=False, minutes=15) -> dict:
    """The report of each shard in `aliases` under "shards" (or {"error": text} for one that could
    not be read), and beside it the totals over the shards that answered, with the keys of a one-shard
    report but "partitions" (each shard has its own)."""
    reports, points = {}, {}
    for alias in aliases:
        try:
            reports[alias] = report(exact=exact, minutes=minutes, using=alias)
            points[alias] = lateness_points(minutes, using=alias)
        except DatabaseError as exc:  # down, or without timeouts' tables: the others are still worth showing
            reports[alias] = {"error": " ".join(str(exc).split()) or type(exc).__name__}
    read = {alias: data for alias, data in reports.items() if "error" not in data}
    return {
        "counts": _summed_counts(read),
        "oldest_overdue": max(({**data["oldest_overdue"], "shard": alias} for alias, data in read.items()
                               if data["oldest_overdue"]), key=lambda oldest: oldest["age_seconds"], default=None),
        "default_partition": _summed_default_rows(read),
        "lateness": _merged_lateness(read, points, minutes),
        "biz_types": _merged_biz_types(read),
        "shards": reports,
    }


def unread_shards(data) -> list[str]:
    """The shards a report of report_of_shards() could not read."""
    return [alias for alias, shard in data.get("shards", {}).items() if "error" in shard]


def lateness_points(minutes=15, using=DEFAULT_DB_ALIAS) -> tuple[int, list[float]]:
    """How many first attempts due in the last `minutes` started, and up to LATENESS_POINTS evenly
    spaced quantiles of their lateness (all of them, sorted, when there are no more)."""
    row = fetch_one("lateness_points", {"window": timedelta(minutes=minutes), "points": LATENESS_POINTS},
                    using=connections[using])
    return row["started"], row["points"] or []


def weighted_quantile(points, q) -> float | None:
    """The `q` quantile of `points`, (value, weight) pairs sorted by value, as PostgreSQL's
    percentile_cont computes it over a list where each value is repeated `weight` times: between
    the two values around rank q * (n - 1), linearly. None without points."""
    if not points:
        return None
    rank = q * (sum(weight for _, weight in points) - 1)
    below = 0.0  # the repeats of the values before this one
    for (value, weight), (following, _) in itertools.pairwise(points):
        last = below + weight - 1  # the rank of this value's last repeat
        if rank <= last:
            return value
        if rank < last + 1:
            return value + (rank - last) * (following - value)
        below += weight
    return points[-1][0]


def _summed_counts(reports) -> dict:
    totals = {}
    for data in reports.values():
        for row in data["counts"]["rows"]:
            key = (row["status"], row["biz_type"])
            totals[key] = totals.get(key, Count(0, True)) + Count(row["count"], row["exact"])
    order = {status.label: status.value for status in Status}
    estimated = [alias for alias, data in reports.items() if data["counts"]["how"] != "exact"]
    how = ("no shard answered" if not reports else f"estimated on {', '.join(estimated)}" if estimated else "exact")
    return {"how": how, "rows": [
        {"status": status, "biz_type": biz_type, "count": c.value, "exact": c.exact}
        for (status, biz_type), c in sorted(totals.items(), key=lambda item: (order[item[0][0]], item[0][1]))]}


def _summed_default_rows(reports) -> dict:
    total = sum((Count(data["default_partition"]["rows"], data["default_partition"]["exact"])
                 for data in reports.values()), Count(0, True))
    return {"rows": total.value, "exact": total.exact}


def _merged_lateness(reports, points, minutes) -> dict:
    """The shards' lateness together: the numbers of tasks summed, the percentiles computed from
    every shard's quantiles, each weighted by the tasks it stands for."""
    parts = [data["lateness"] for data in reports.values()]
    weighted = sorted((value, started / len(values)) for started, values in points.values() if values
                      for value in values)
    p50, p90, p99 = (weighted_quantile(weighted, q) for q in (0.5, 0.9, 0.99))
    return {"minutes": minutes, **{key: sum(part[key] for part in parts) for key in ("due", "waiting", "started")},
            "p50": p50, "p90": p90, "p99": p99,
            "max": max((part["max"] for part in parts if part["max"] is not None), default=None),
            "percentiles_exact": all(started <= LATENESS_POINTS for started, _ in points.values())}


def _merged_biz_types(reports) -> list[dict]:
    """Each biz_type once: its overdue and running tasks summed, its limits those of the first shard
    that lists it. Limits are written to every shard, but a shard that was down then missed the
    change: `limits_differ_on` names the shards whose limits in force are not the ones shown."""
    merged = {}
    for alias, data in reports.items():
        for row in data["biz_types"]:
            seen = merged.get(row["biz_type"])
            if seen is None:
                # A shard's part of the limits is its own: the totals show the whole.
                merged[row["biz_type"]] = {**row, "sources": list(row["sources"]), "rate_part": None,
                                           "concurrency_part": None}
                continue
            seen["sources"] += [source for source in row["sources"] if source not in seen["sources"]]
            for key in ("overdue", "running"):
                seen[key] += row[key]
                seen[f"{key}_exact"] = seen[f"{key}_exact"] and row[f"{key}_exact"]
            if any(seen[key] != row[key] for key in LIMIT_KEYS):
                seen.setdefault("limits_differ_on", []).append(alias)
    return [merged[name] for name in sorted(merged)]
