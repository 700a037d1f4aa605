"""Actors of the race scenarios, run as processes of the system under test (race_tools.spawn_actor):
Django on the system's database, the library's own public calls, results as JSON.

    python -m tests.reliability.race_actors storm SPEC.json OUT.json      # cancel storm
    python -m tests.reliability.race_actors maintain SPEC.json OUT.json   # partition maintenance loop

Every 40001 (serialization failure) that timeouts.store.serialization retries in this process is counted: the
wrapper below sees each failure retry_on_conflict() classifies (it looks the function up at call
time).
"""

import json
import random
import sys
import threading
import time
from datetime import datetime, timedelta

import django

SERIALIZATION_FAILURES = []  # one entry per 40001 seen by retry_on_conflict
LOCK = threading.Lock()


def count_serialization_failures():
    from timeouts.store import serialization as retry

    original = retry.is_serialization_failure

    def counting(exc):
        found = original(exc)
        if found:
            with LOCK:
                SERIALIZATION_FAILURES.append(time.time())
        return found

    retry.is_serialization_failure = counting


def task_at(job_id, action_time):
    """A TimeoutTask instance as a caller would hold it (possibly stale: the row may have moved)."""
    from timeouts.models import TimeoutTask

    return TimeoutTask._from_row({"job_id": job_id, "action_time": datetime.fromisoformat(action_time),
                                 "biz_type": "oracle.ok"})


def sleep_until(wall_time):
    delay = wall_time - time.time()
    if delay > 0:
        time.sleep(delay)


# -- the cancel storm -----------------------------------------------------------------------------

def storm(spec) -> dict:
    """spec: {"oracle_dsn", "provoke": [job...], "reschedule": [job...], "cancel": [job...],
    "threads"}, a job being {"job_id", "biz_id", "action_time" (as scheduled), "due" (wall time,
    epoch seconds, it comes due or is rescheduled to), "by_key" (cancel through the manager)}."""
    from django.db import connection

    from tests.reliability.oracle import Oracle

    count_serialization_failures()
    results = {"provoked": provoke_moves(spec["provoke"], spec["oracle_dsn"])}
    results["provoked_40001"] = len(SERIALIZATION_FAILURES)
    connection.close()
    outcomes = {"True": 0, "False": 0, "error": 0}
    errors = []
    lag = []

    def cancel_some(jobs):
        oracle = Oracle(spec["oracle_dsn"])
        try:
            for job in jobs:
                # Around the moment it comes due: a little before (PENDING), at (being claimed) or
                # after (DISPATCHED, its message on its way to a worker, or already running).
                sleep_until(job["due"] + random.uniform(-0.2, 0.5))
                result = cancel_one(job, oracle, errors)
                with LOCK:
                    outcomes[str(result) if result is not None else "error"] += 1
                    lag.append(time.time() - job["due"])
        finally:
            oracle.close()
            connection.close()

    def reschedule_all(jobs):
        try:
            for job in jobs:
                sleep_until(job["due"] - random.uniform(0.5, 2.0))
                moved = task_at(job["job_id"], job["action_time"]).reschedule(at=datetime.fromtimestamp(
                    job["due"]).astimezone())
                with LOCK:
                    results.setdefault("rescheduled", 0)
                    results["rescheduled"] += bool(moved)
        finally:
            connection.close()

    workers = [threading.Thread(target=reschedule_all, args=(spec["reschedule"],))]
    cancels = sorted(spec["cancel"], key=lambda job: job["due"])
    workers += [threading.Thread(target=cancel_some, args=(cancels[n::spec["threads"]],))
                for n in range(spec["threads"])]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    lag.sort()
    results.update(cancels=outcomes, errors=errors[:20], storm_40001=len(SERIALIZATION_FAILURES)
                   - results["provoked_40001"], cancel_lag_p50=lag[len(lag) // 2] if lag else None,
                   cancel_lag_max=lag[-1] if lag else None)
    return results


def cancel_one(job, oracle, errors):
    """Cancel through the public API, record the result in the oracle; None if it raised."""
    from django.db import DatabaseError

    from timeouts.models import TimeoutTask

    try:
        if job["by_key"]:
            result = TimeoutTask.objects.cancel("oracle.ok", job["biz_id"]) == 1
        else:
            result = task_at(job["job_id"], job["action_time"]).cancel()
    except DatabaseError as exc:  # recorded as unknown: the checker then looks at the row
        oracle.record_cancel(job["job_id"], None)
        with LOCK:
            errors.append(f"job {job['job_id']}: {type(exc).__name__}: {exc}")
        return None
    oracle.record_cancel(job["job_id"], result)
    return result


def provoke_moves(jobs, oracle_dsn) -> list:
    """For each job (scheduled in another partition than its "due"): hold a transaction that
    reschedules it across partitions, cancel it from another thread with the stale instance (its
    UPDATE waits for the row lock), then commit the move: the cancel's statement fails with 40001
    ("tuple to be locked was already moved to another partition"), which must be retried, follow the
    row, and cancel it (True)."""
    from django.db import connection

    from tests.reliability.oracle import Oracle

    oracle = Oracle(oracle_dsn)
    try:
        return [provoke_one(job, oracle) for job in jobs]
    finally:
        connection.close()
        oracle.close()


def provoke_one(job, oracle) -> dict:
    from django.db import connection, transaction

    outcome = {"errors": []}
    holding = threading.Event()

    def cancel_when_held():
        holding.wait(30)
        try:
            outcome["cancel"] = cancel_one(job, oracle, outcome["errors"])
        finally:
            connection.close()

    canceller = threading.Thread(target=cancel_when_held)
    canceller.start()
    try:
        with transaction.atomic():
            new_time = datetime.fromtimestamp(job["due"]).astimezone()
            outcome["moved"] = task_at(job["job_id"], job["action_time"]).reschedule(at=new_time)
            holding.set()
            outcome["waited"] = wait_for_blocked(connection, connection.connection.info.backend_pid)
    finally:
        holding.set()
        canceller.join(60)
    return outcome


def wait_for_blocked(connection, holder_pid, timeout=15.0) -> bool:
    """Poll (from a connection of its own) until some backend waits for a lock `holder_pid` holds."""
    import psycopg

    settings = connection.settings_dict
    with psycopg.connect(host=settings["HOST"], port=settings["PORT"], user=settings["USER"],
                         dbname=settings["NAME"], autocommit=True) as probe:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            blocked = probe.execute("SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                                    (holder_pid,)).fetchone()[0]
            if blocked:
                return True
            time.sleep(0.01)
    return False


# -- the maintenance loop -------------------------------------------------------------------------

def maintain(spec) -> dict:
    """spec: {"seconds", "max_rounds", "park_rows"}. Round r (back to back until `seconds` have passed):
    park `park_rows` finished rows in DEFAULT in a past bucket beyond retention and as many in a
    future bucket just past the window, then run maintain() as if r + 1 days had passed (capped at 6,
    so no live partition can expire): it creates the bucket that comes into the window ahead (moving
    the parked future rows out of DEFAULT), creates the parked past bucket (moving its rows) and
    drops it. Returns the DDL window (database clock) and what each round did."""
    from django.db import connection

    from timeouts.storage.partitions import maintain as run_maintenance
    from timeouts.store.queries import fetch_one

    rounds = []
    started = time.monotonic()
    window_start = fetch_one("database_now")["now"]
    for r in range(spec["max_rounds"]):
        if r and time.monotonic() - started > spec["seconds"]:
            break
        offset = min(r + 1, 6)
        now = fetch_one("database_now")["now"]
        with connection.cursor() as cursor:
            for days in (-(10 + r), 14 + offset):
                cursor.execute(
                    "INSERT INTO timeouts_task (biz_type, biz_id, action_time, run_at, attribute, max_attempts, ttr, "
                    "status, created_at, modified_at, finished_at) "
                    "SELECT 'oracle.ok', 'parked-' || n, t, t, '{}', 1, 5, 3, t, t, t "
                    "FROM generate_series(1, %s) AS n, (SELECT %s::timestamptz AS t) AS due",
                    (spec["park_rows"], now + timedelta(days=days)))
        began = time.monotonic()
        report = run_maintenance(now=now + timedelta(days=offset))
        rounds.append({"round": r, "seconds": round(time.monotonic() - began, 3), "created": report.created,
                       "moved": report.total_moved, "dropped": report.dropped, "failed": report.failed,
                       "default_rows": report.default_rows})
    return {"window": [window_start.isoformat(), fetch_one("database_now")["now"].isoformat()], "rounds": rounds}


COMMANDS = {"storm": storm, "maintain": maintain}

if __name__ == "__main__":
    command, spec_path, out_path = sys.argv[1:4]
    django.setup()
    with open(spec_path) as spec_file:
        output = COMMANDS[command](json.load(spec_file))
    with open(out_path, "w") as out:
        json.dump(output, out, default=str)
