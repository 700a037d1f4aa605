"""Schedule throughput: schedule() and bulk_schedule(), with and without NOTIFY, against raw
single-row INSERT and raw COPY of the same rows into the same table, in the same run.

NOTIFY is sent only for tasks due within NOTIFY_HORIZON: "with" schedules tasks due in a few
seconds, "without" tasks due in an hour. A LISTEN connection counts the notifications, so the JSON
shows that "with" really notified and "without" did not.

The single-row variants take turns, a tenth of their rows at a time (TURNS), on one table emptied
before them: one call costs well under a millisecond, and the machine's speed drifts within a
minute, which, run one after the other, would fall on one variant and not the next. Each turn
starts one variant later, so none always follows the same one. They all run on one connection,
the bench alias's Django connection (the raw INSERTs through a plain psycopg cursor on it, which
binds on the server and is prepared like schedule()'s INSERT): a block of calls that follows a
block on another connection runs slower all through, whichever code it runs, so with a connection
each the ratio would depend on the order. Nothing waits between the turns: a block that starts
after the machine idled runs its CPU-heavier calls slower, so the notifications are counted once,
after the last turn, each variant's by the second its tasks are due in. "raw INSERT + NOTIFY"
notifies from the same statement, as schedule() does for a task due soon: NOTIFY's own cost, apart
from ours.
The bulk variants run one after the other, each on an empty table.
"""

import json
import time
from datetime import timedelta

import psycopg
from django.db import connections

from timeouts.conf import get_settings

from .database import reset
from .handlers import NOOP
from .progress import Progress
from .workload import db_now, schedule_bulk, schedule_each

# What a task needs written; the rest (a trace context, say) is NULL, as for a call without one.
RAW_COLUMNS = ("biz_type", "biz_id", "action_time", "run_at", "attribute", "max_attempts", "ttr")
RAW_INSERT = (f"INSERT INTO timeouts_task ({', '.join(RAW_COLUMNS)}) "
              "VALUES (%s, %s, %s, %s, %s::jsonb, %s, %s)")
RAW_INSERT_NOTIFY = RAW_INSERT + " RETURNING pg_notify(%s, extract(epoch FROM run_at)::text) IS NOT NULL"
RAW_COPY = f"COPY timeouts_task ({', '.join(RAW_COLUMNS)}) FROM STDIN"

# (name, notify): the single-row variants, taking turns
# "single_keyed": schedule() with its default on_conflict ("error"), the key's lock and read first.
SINGLE_VARIANTS = (("raw_insert", False), ("single", False), ("single_notify", True), ("raw_insert_notify", True),
                   ("single_keyed", False))
TURNS = 10
NEVER_NOTIFIED = "NOTIFY_HORIZON is 0: nothing is ever notified"
# (name, kind, notify) of the bulk variants, in the order they run within a repeat
BULK_VARIANTS = (
    ("raw_copy", "raw_copy", False),
    ("bulk", "bulk", False),
    ("bulk_notify", "bulk", True),
)


def _rows(times):
    settings = get_settings()
    attribute = json.dumps({})
    return [(NOOP, str(key), at, at, attribute, settings.DEFAULT_MAX_ATTEMPTS, settings.DEFAULT_TTR)
            for key, at in enumerate(times)]


def _times(conn, n, notify, second=0):
    """n due times within one second: `second` seconds after the first one of their kind."""
    horizon = get_settings().NOTIFY_HORIZON
    ahead = min(10.0, horizon / 2) if notify else 3600.0
    base = db_now(conn) + timedelta(seconds=ahead + second)
    return [base + timedelta(milliseconds=i % 1000) for i in range(n)]


def raw_single(conn, rows, channel=None):
    """One autocommit INSERT per row; with `channel`, each also NOTIFYs there."""
    query, extra = (RAW_INSERT, ()) if channel is None else (RAW_INSERT_NOTIFY, (channel,))
    with psycopg.Cursor(conn) as cursor:  # binds on the server, whatever the connection's default
        for row in rows:
            cursor.execute(query, row + extra)


def raw_copy(conn, rows) -> float:
    started = time.perf_counter()
    with conn.transaction(), conn.cursor().copy(RAW_COPY) as copy:
        for row in rows:
            copy.write_row(row)
    return len(rows) / (time.perf_counter() - started)


def run(ctx, rep) -> dict:
    """One repeat: every variant once. Returns {variant: result}."""
    channel = get_settings().NOTIFY_CHANNEL
    with ctx.db.connect() as listener:
        listener.execute(f'LISTEN "{channel}"')
        results = _single_row(ctx, listener)
        results.update(_bulk(ctx, listener))
    reset(ctx.conn)
    results["ratios"] = {
        "single_vs_raw_insert": _ratio(results["single"].get("sched_per_s"), results["raw_insert"]["sched_per_s"]),
        "single_keyed_vs_raw_insert": _ratio(results["single_keyed"].get("sched_per_s"),
                                             results["raw_insert"]["sched_per_s"]),
        "single_notify_vs_raw_insert": _ratio(results["single_notify"].get("sched_per_s"),
                                              results["raw_insert"]["sched_per_s"]),
        "single_notify_vs_raw_insert_notify": _ratio(results["single_notify"].get("sched_per_s"),
                                                     results.get("raw_insert_notify", {}).get("sched_per_s")),
        "bulk_vs_raw_copy": _ratio(results["bulk"].get("sched_per_s"), results["raw_copy"]["sched_per_s"]),
        "bulk_notify_vs_raw_copy": _ratio(results["bulk_notify"].get("sched_per_s"),
                                          results["raw_copy"]["sched_per_s"]),
    }
    return results


def _single_row(ctx, listener) -> dict:
    """raw INSERT, schedule() and schedule() with NOTIFY, and raw INSERT + NOTIFY, a tenth of their
    rows at a time in turn, on one connection."""
    n = ctx.cfg.n_single
    settings = get_settings()
    variants = [(name, notify) for name, notify in SINGLE_VARIANTS if not notify or settings.NOTIFY_HORIZON > 0]
    reset(ctx.conn)
    # Each variant's tasks are due within a second of their own, so a notification tells whose it is.
    times, of_kind = {}, {False: 0, True: 0}
    for name, notify in variants:
        times[name] = _times(ctx.conn, n, notify, second=of_kind[notify])
        of_kind[notify] += 1
    raw_rows = {name: _rows(times[name]) for name in times if name.startswith("raw_insert")}
    connection = connections[ctx.alias]
    connection.ensure_connection()
    seconds = dict.fromkeys(times, 0.0)
    progress = Progress("raw INSERT / schedule() / with NOTIFY, in turns", n * len(variants))
    step = max(1, -(-n // TURNS))
    for turn, first in enumerate(range(0, n, step)):
        last = min(n, first + step)
        for name, notify in variants[turn % len(variants):] + variants[:turn % len(variants)]:
            started = time.perf_counter()
            if name.startswith("raw_insert"):
                raw_single(connection.connection, raw_rows[name][first:last],
                           settings.NOTIFY_CHANNEL if notify else None)
            else:
                schedule_each(ctx.alias, range(first, last), times[name][first:last], keyed=name == "single_keyed")
            seconds[name] += time.perf_counter() - started
        progress.update(last * len(variants))
    progress.finish(n * len(variants))
    notifications = _notifications_by_variant(listener, times)
    apis = {"raw_insert": "raw INSERT (autocommit)", "single": "schedule()", "single_notify": "schedule()",
            "raw_insert_notify": "raw INSERT + NOTIFY (autocommit)", "single_keyed": 'schedule(on_conflict="error")'}
    results = {name: {"sched_api": apis[name], "sched_per_s": round(n / seconds[name]), "n": n, "turns": TURNS,
                      "notifications": notifications[name]} for name in seconds}
    for name, _notify in SINGLE_VARIANTS:
        if name not in results:
            results[name] = {"n": n, "skipped": NEVER_NOTIFIED}
    return results


def _notifications_by_variant(listener, times) -> dict:
    """Read every notification delivered so far (until none comes for half a second) and count each
    for the variant whose tasks are due in the second its payload (a deadline) falls in."""
    windows = {name: (due[0].timestamp(), due[0].timestamp() + 1.0) for name, due in times.items()}
    counts = dict.fromkeys(times, 0)
    while True:
        payloads = [float(note.payload) for note in listener.notifies(timeout=0.5)]
        if not payloads:
            return counts
        for deadline in payloads:
            for name, (start, end) in windows.items():
                if start <= deadline < end:
                    counts[name] += 1


def _bulk(ctx, listener) -> dict:
    results = {}
    for name, kind, notify in BULK_VARIANTS:
        n = ctx.cfg.n_bulk
        if notify and get_settings().NOTIFY_HORIZON <= 0:
            results[name] = {"n": n, "skipped": NEVER_NOTIFIED}
            continue
        reset(ctx.conn)
        times = _times(ctx.conn, n, notify)
        if kind == "raw_copy":
            out = {"sched_api": "raw COPY (1 transaction)", "sched_per_s": round(raw_copy(ctx.conn, _rows(times)))}
        else:
            out = schedule_bulk(ctx.alias, times, chunk=ctx.cfg.bulk_chunk)
        out["n"] = n
        out["notifications"] = sum(1 for _ in listener.notifies(timeout=0.5))
        results[name] = out
    return results


def _ratio(a, b):
    return round(a / b, 3) if a and b else None
