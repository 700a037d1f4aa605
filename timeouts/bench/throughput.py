"""Schedule throughput: schedule() and bulk_schedule(), with and without NOTIFY, against raw
single-row INSERT and raw COPY of the same rows into the same table, in the same run.

NOTIFY is sent only for tasks due within NOTIFY_HORIZON: "with" schedules tasks due in a few
seconds, "without" tasks due in an hour. A LISTEN connection counts the notifications, so the JSON
shows that "with" really notified and "without" did not. The table is emptied before each variant.
"""

import json
import time
from datetime import timedelta

from timeouts.conf import get_settings
from timeouts.scheduling import COPY_COLUMNS

from .database import reset
from .handlers import NOOP
from .progress import Progress
from .workload import db_now, schedule_bulk, schedule_single

RAW_INSERT = (f"INSERT INTO timeouts_task ({', '.join(COPY_COLUMNS)}) "
              "VALUES (%s, %s, %s, %s, %s::jsonb, %s, %s)")
RAW_COPY = f"COPY timeouts_task ({', '.join(COPY_COLUMNS)}) FROM STDIN"

# (name, kind, notify) in the order they run within a repeat
VARIANTS = (
    ("raw_insert", "raw_single", False),
    ("single", "single", False),
    ("single_notify", "single", True),
    ("raw_copy", "raw_copy", False),
    ("bulk", "bulk", False),
    ("bulk_notify", "bulk", True),
)


def _rows(times):
    settings = get_settings()
    attribute = json.dumps({})
    return [(NOOP, str(key), at, at, attribute, settings.DEFAULT_MAX_ATTEMPTS, settings.DEFAULT_TTR)
            for key, at in enumerate(times)]


def _times(conn, n, notify):
    horizon = get_settings().NOTIFY_HORIZON
    ahead = min(10.0, horizon / 2) if notify else 3600.0
    base = db_now(conn) + timedelta(seconds=ahead)
    return [base + timedelta(milliseconds=i % 1000) for i in range(n)]


def raw_single(conn, rows) -> float:
    progress = Progress("raw INSERT", len(rows))
    started = time.perf_counter()
    with conn.cursor() as cursor:
        for i, row in enumerate(rows):
            cursor.execute(RAW_INSERT, row)
            if i % 500 == 0:
                progress.update(i)
    seconds = time.perf_counter() - started
    progress.finish(len(rows))
    return len(rows) / seconds


def raw_copy(conn, rows) -> float:
    started = time.perf_counter()
    with conn.transaction(), conn.cursor().copy(RAW_COPY) as copy:
        for row in rows:
            copy.write_row(row)
    return len(rows) / (time.perf_counter() - started)


def run(ctx, rep) -> dict:
    """One repeat: every variant once, in a fixed interleaved order. Returns {variant: result}."""
    cfg = ctx.cfg
    channel = get_settings().NOTIFY_CHANNEL
    results = {}
    with ctx.db.connect() as listener:
        listener.execute(f'LISTEN "{channel}"')
        for name, kind, notify in VARIANTS:
            n = cfg.n_single if kind in ("raw_single", "single") else cfg.n_bulk
            if notify and get_settings().NOTIFY_HORIZON <= 0:
                results[name] = {"n": n, "skipped": "NOTIFY_HORIZON is 0: nothing is ever notified"}
                continue
            reset(ctx.conn)
            times = _times(ctx.conn, n, notify)
            if kind == "raw_single":
                out = {"sched_api": "raw INSERT (autocommit)", "sched_per_s": round(raw_single(ctx.conn, _rows(times)))}
            elif kind == "raw_copy":
                out = {"sched_api": "raw COPY (1 transaction)", "sched_per_s": round(raw_copy(ctx.conn, _rows(times)))}
            elif kind == "single":
                out = schedule_single(ctx.alias, times, label=f"schedule(){' with NOTIFY' if notify else ''}")
                out.pop("sched_overrun", None)
            else:
                out = schedule_bulk(ctx.alias, times, chunk=cfg.bulk_chunk)
            out["n"] = n
            out["notifications"] = sum(1 for _ in listener.notifies(timeout=0.5))
            results[name] = out
    reset(ctx.conn)
    single, bulk = results["single"].get("sched_per_s"), results["bulk"].get("sched_per_s")
    results["ratios"] = {
        "single_vs_raw_insert": _ratio(single, results["raw_insert"]["sched_per_s"]),
        "single_notify_vs_raw_insert": _ratio(results["single_notify"].get("sched_per_s"),
                                              results["raw_insert"]["sched_per_s"]),
        "bulk_vs_raw_copy": _ratio(bulk, results["raw_copy"]["sched_per_s"]),
        "bulk_notify_vs_raw_copy": _ratio(results["bulk_notify"].get("sched_per_s"), results["raw_copy"]["sched_per_s"]),
    }
    return results


def _ratio(a, b):
    return round(a / b, 3) if a and b else None
