"""From what was expected and what started to the numbers of a run.

Lateness is started_at - action_time on the database clock. A task is missing when it never
started, started twice when it has more than one start row, early when any start precedes its
action_time. Percentiles are nearest-rank, as in the peer harness, so the two compare exactly.
"""

import statistics

from .handlers import NOOP

TIMEOUTS_STARTS = """
SELECT t.job_id, t.action_time, s.started_at
FROM timeouts_task AS t LEFT JOIN timeouts_bench_start AS s ON s.job_id = t.job_id
WHERE t.biz_type = %s
"""

CLAIM_BATCHES = """
SELECT dispatched_at, count(*) FROM timeouts_task
WHERE biz_type = %s AND dispatched_at IS NOT NULL GROUP BY dispatched_at ORDER BY dispatched_at
"""


def pct(sorted_values, p):
    if not sorted_values:
        return None
    i = min(len(sorted_values) - 1, max(0, round(p / 100.0 * len(sorted_values) + 0.5) - 1))
    return sorted_values[i]


def rnd(x, digits=2):
    return None if x is None else round(x, digits)


def analyze(expected: dict, starts) -> dict:
    """expected: {key: action_time}; starts: iterable of (key, started_at)."""
    first, total, early, unexpected = {}, 0, 0, 0
    for key, started_at in starts:
        if key not in expected:
            unexpected += 1
            continue
        total += 1
        if started_at < expected[key]:
            early += 1
        if key not in first or started_at < first[key]:
            first[key] = started_at
    late = sorted((first[k] - expected[k]).total_seconds() * 1000.0 for k in first)
    times = sorted(first.values())
    span = (times[-1] - times[0]).total_seconds() if len(times) > 1 else 0.0
    return {
        "n": len(expected), "started": len(first), "missing": len(expected) - len(first),
        "duplicates": total - len(first), "early": early, "unexpected": unexpected,
        "p50_ms": rnd(pct(late, 50)), "p90_ms": rnd(pct(late, 90)), "p99_ms": rnd(pct(late, 99)),
        "max_ms": rnd(late[-1] if late else None), "min_ms": rnd(late[0] if late else None),
        "start_per_s": round((len(times) - 1) / span) if span > 0 else None,
        "first_start": times[0] if times else None, "last_start": times[-1] if times else None,
    }


def timeouts_run(conn) -> dict:
    """Stats of a timeouts path: the bench's tasks joined to their start rows."""
    expected, starts = {}, []
    for job_id, action_time, started_at in conn.execute(TIMEOUTS_STARTS, (NOOP,)):
        expected[job_id] = action_time
        if started_at is not None:
            starts.append((job_id, started_at))
    return analyze(expected, starts)


def direct_starts(conn):
    return conn.execute("SELECT job_id, started_at FROM timeouts_bench_start WHERE job_id >= 0").fetchall()


def claim_rate(conn) -> dict:
    """Claimed-and-published rate from the claim times (each claim's now(), shared by its batch).

    A claimer publishes a batch before it claims the next one, so the time from one claim to the
    next is one claim plus one publish. The rate is taken over the leading run of full batches:
    once the backlog runs out, or backpressure (MAX_DISPATCHED) caps the claims, batches shrink
    and their pace is the workers', not the claimer's.
    """
    batches = conn.execute(CLAIM_BATCHES, (NOOP,)).fetchall()
    out = {"claim_batches": len(batches), "claim_per_s": None}
    if len(batches) < 2:
        return out
    full = max(count for _, count in batches)
    k = next((i for i, (_, count) in enumerate(batches) if count < full), len(batches) - 1)
    k = max(k, 1)
    span = (batches[k][0] - batches[0][0]).total_seconds()
    if span > 0:
        out["claim_per_s"] = round(sum(count for _, count in batches[:k]) / span)
        out["claim_rate_over"] = sum(count for _, count in batches[:k])
    return out


def rate_of_middle(times, share=0.9):
    """Events per second over the middle `share` of sorted event times; None for fewer than 20."""
    if len(times) < 20:
        return None
    cut = int(len(times) * (1 - share) / 2)
    middle = times[cut:len(times) - cut]
    span = middle[-1] - middle[0]
    return round((len(middle) - 1) / span, 1) if span > 0 else None


def summarize(values):
    """{median, min, max} of the numbers among values (None when there are none)."""
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if not numbers:
        return None
    return {"median": statistics.median(numbers), "min": min(numbers), "max": max(numbers), "runs": len(numbers)}
