"""The tasks of a scenario: due times, and the two ways in: the timeouts API, or Celery directly."""

import random
import time
from contextlib import nullcontext
from datetime import timedelta

from timeouts.states import Status

from .handlers import DIRECT_TASK, NOOP, PROBE, WARM_TASK
from .progress import Progress


def db_now(conn):
    return conn.execute("SELECT clock_timestamp()").fetchone()[0]


def due_times(scenario, n, *, base, window=0.0, seed=0):
    """Due times: spread uniformly over `window` from `base` (random order), all at `base`, or past."""
    if scenario == "spread":
        rng = random.Random(seed)
        return [base + timedelta(seconds=rng.random() * window) for _ in range(n)]
    return [base] * n


# The bench schedules with on_conflict=None: the plain INSERT and COPY paths, which its targets
# compare with raw INSERT and COPY. The default, "error", adds the key's lock and read: the schedule
# scenario times it beside them (schedule_each(keyed=True)).


def _manager(alias):
    from timeouts.models import TimeoutTask

    return TimeoutTask.objects.db_manager(alias)


def schedule_single(alias, times, *, biz_type=NOOP, label="schedule()", within=nullcontext) -> dict:
    """schedule() once per task; counts the tasks whose call returned after their due time.
    `within()`: what each call runs in (the tracing scenario: a span of its own, as a request's)."""
    manager, over = _manager(alias), 0
    progress = Progress(label, len(times))
    started = time.perf_counter()
    for key, at in enumerate(times):
        with within():
            manager.schedule(biz_type, biz_id=key, at=at, on_conflict=None)
        if time.time() > at.timestamp():
            over += 1
        if key % 200 == 0:
            progress.update(key)
    seconds = time.perf_counter() - started
    progress.finish(len(times))
    return {"sched_api": "schedule()", "sched_per_s": round(len(times) / seconds), "sched_overrun": over}


def schedule_each(alias, keys, times, *, biz_type=NOOP, keyed=False):
    """schedule() once per task, nothing else (the schedule throughput scenario times it). `keyed`:
    with the default on_conflict ("error": the key's lock and read), on keys of their own."""
    manager = _manager(alias)
    for key, at in zip(keys, times, strict=True):
        if keyed:
            manager.schedule(biz_type, biz_id=f"keyed-{key}", at=at)
        else:
            manager.schedule(biz_type, biz_id=key, at=at, on_conflict=None)


def schedule_bulk(alias, times, *, chunk, biz_type=NOOP, within=nullcontext) -> dict:
    """bulk_schedule() `chunk` tasks per call, each call in `within()`."""
    manager = _manager(alias)
    started = time.perf_counter()
    for i in range(0, len(times), chunk):
        with within():
            manager.bulk_schedule([{"biz_type": biz_type, "biz_id": i + j, "at": at, "on_conflict": None}
                                   for j, at in enumerate(times[i:i + chunk])])
    seconds = time.perf_counter() - started
    return {"sched_api": f"bulk_schedule() ({chunk}/call)", "sched_per_s": round(len(times) / seconds)}


def publish_direct(app, times, *, eta: bool, label="apply_async()") -> dict:
    """The Celery baseline: one apply_async() per task over one producer, with eta= or already due."""
    over = 0
    progress = Progress(label, len(times))
    started = time.perf_counter()
    with app.producer_or_acquire() as producer:
        for key, at in enumerate(times):
            app.signature(DIRECT_TASK, args=(key, at.isoformat())).apply_async(
                eta=at if eta else None, producer=producer)
            if eta and time.time() > at.timestamp():
                over += 1
            if key % 200 == 0:
                progress.update(key)
    seconds = time.perf_counter() - started
    progress.finish(len(times))
    out = {"sched_api": "apply_async(eta=)" if eta else "apply_async()", "sched_per_s": round(len(times) / seconds)}
    if eta:
        out["sched_overrun"] = over
    return out


def warm_worker(app, conn, *, count, check, timeout=90.0):
    """Send `count` warm-up messages and wait until all ran: the worker is up and its processes hold
    their connections. Their start rows (negative keys) are then deleted."""
    for key in range(1, count + 1):
        app.signature(WARM_TASK, args=(-key,)).apply_async()
    warmed = "SELECT count(*) FROM timeouts_bench_start WHERE job_id < 0"
    wait_until(lambda: conn.execute(warmed).fetchone()[0] >= count,
               timeout, check, "the Celery worker to run its warm-up messages")
    conn.execute("DELETE FROM timeouts_bench_start WHERE job_id < 0")


def probe_path(alias, conn, *, count, check, timeout):
    """Send `count` tasks due now through the path under test and wait until they are DONE: the
    dispatcher (or scan loop) is up, and the whole chain down to the worker has run once."""
    now = db_now(conn)
    for key in range(count):
        _manager(alias).schedule(PROBE, biz_id=f"probe-{key}", at=now, on_conflict=None)
    wait_until(lambda: conn.execute("SELECT count(*) FROM timeouts_task WHERE biz_type = %s AND status = %s",
                                    (PROBE, Status.DONE)).fetchone()[0] >= count,
               timeout, check, "the probe tasks to run through the path under test")


def wait_until(predicate, timeout, check, what, interval=0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        check()
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def wait_for_starts(conn, n, *, deadline, check, label, settle=1.0) -> bool:
    """Wait until n distinct keys started or the (monotonic) deadline passed, then `settle` seconds
    more so that a second start of a task has time to show. True if all n started."""
    progress = Progress(label, n)
    count = 0
    while time.monotonic() < deadline:
        count = conn.execute("SELECT count(*) FROM timeouts_bench_start WHERE job_id >= 0").fetchone()[0]
        progress.update(count)
        if count >= n and conn.execute(
                "SELECT count(DISTINCT job_id) FROM timeouts_bench_start WHERE job_id >= 0").fetchone()[0] >= n:
            break
        check()
        time.sleep(0.5)  # light polling: the measured processes share the cores
    progress.finish(count)
    time.sleep(settle)
    return count >= n
