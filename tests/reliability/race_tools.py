"""Helpers of the race scenarios (test_races*.py): their scale, scheduling tens of thousands of tasks at
once (recorded in the oracle), lateness statistics, and running a child actor (race_actors.py).

TIMEOUTS_RELIABILITY_SCALE (default 1.0) multiplies every size: 1.0 is the size CI runs (15,000 tasks
per race scenario), larger scales a longer race; 0.1 makes a quick run on a busy machine.
"""

import json
import math
import os
import sys
import time

import psycopg

from tests.support import processes
from timeouts.states import Status

SCALE = float(os.environ.get("TIMEOUTS_RELIABILITY_SCALE", "1.0"))
# The worker that runs the handlers: the handler mostly waits on its two databases, so 8 threads start
# several times more tasks a second than a prefork pool of 2 on a 2-core machine.
WORKER = {"concurrency": 8, "pool": "threads"}
# Backpressure by the README's rule, MAX_DISPATCHED <= (tasks started per second) x TTR / 2: oracle.ok's
# TTR is 5 s and a shared, loaded machine starts few tasks a second. The default (1,000) lets claims
# wait in the broker past their lease: recovery then re-dispatches them again and again, filling the
# broker with messages the worker has to drop, and a scenario's tasks are not final for minutes.
MAX_DISPATCHED = 100


def scaled(n, minimum=1) -> int:
    return max(minimum, round(n * SCALE))


def timeout_for(seconds_at_full_scale, fixed=120) -> int:
    """A pytest timeout: the fixed part (clusters, processes) plus the part that grows with the scale."""
    return int(fixed + seconds_at_full_scale * SCALE)


def database_now(dsn):
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        return conn.execute("SELECT clock_timestamp()").fetchone()[0]


def insert_tasks(sut_dsn, oracle, biz_type, biz_ids, due_times) -> list[tuple[int, str, object]]:
    """Create one task per (biz_id, due time) in ONE statement and transaction, then record them in
    the oracle as committed; returns [(job_id, biz_id, action_time)] in input order.

    The library's own bulk_schedule() (a COPY) needs Django on the system's database; this writes the
    same columns with the same values (prepare() gives max_attempts and ttr) and sends the one NOTIFY
    a batch sends, so the dispatchers wake for the earliest deadline. Fifty thousand rows take about
    a second this way, against a minute through insert_task one by one."""
    from timeouts.conf import notify_params
    from timeouts.store.scheduling import prepare

    template = prepare(biz_type, "template", delay=0)
    params = notify_params()
    with psycopg.connect(sut_dsn, connect_timeout=10) as conn:
        rows = conn.execute(
            "INSERT INTO timeouts_task (biz_type, biz_id, action_time, run_at, attribute, max_attempts, ttr, "
            "created_at, modified_at) "
            "SELECT %s, u.biz_id, u.due, u.due, '{}'::jsonb, %s, %s, clock_timestamp(), clock_timestamp() "
            "FROM unnest(%s::text[], %s::timestamptz[]) WITH ORDINALITY AS u(biz_id, due, n) ORDER BY u.n "
            "RETURNING job_id, biz_id, action_time",
            (biz_type, template.max_attempts, template.ttr, [str(b) for b in biz_ids], list(due_times)),
        ).fetchall()
        conn.execute("SELECT timeouts_notify_v1(%s, %s, clock_timestamp() + %s * interval '1 second')",
                     (params["channel"], min(due_times), params["horizon"]))
        conn.commit()
    by_biz_id = {biz_id: (job_id, biz_id, due) for job_id, biz_id, due in rows}
    jobs = [by_biz_id[str(b)] for b in biz_ids]
    with oracle.conn.cursor() as cursor, cursor.copy(
            "COPY oracle_scheduled (job_id, biz_type, biz_id, outcome) FROM STDIN") as copy:
        for job_id, biz_id, _due in jobs:
            copy.write_row((job_id, biz_type, biz_id, "committed"))
    return jobs


def percentile(values, fraction) -> float:
    """Nearest-rank percentile (0 < fraction <= 1) of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def lateness_summary(seconds) -> str:
    if not seconds:
        return "no tasks"
    return (f"{len(seconds)} tasks, p50 {percentile(seconds, 0.5):.3f} s, p99 {percentile(seconds, 0.99):.3f} s, "
            f"max {max(seconds):.3f} s")


def start_lateness(sut_dsn, since=None, until=None) -> list[float]:
    """started_at - action_time (seconds, the system's clock) of the DONE tasks due in [since, until]."""
    sql = ("SELECT extract(epoch FROM started_at - action_time)::float8 FROM timeouts_task "
           "WHERE status = %s AND action_time >= coalesce(%s::timestamptz, '-infinity') "
           "AND action_time <= coalesce(%s::timestamptz, 'infinity')")
    with psycopg.connect(sut_dsn, autocommit=True, connect_timeout=10) as conn:
        return [row[0] for row in conn.execute(sql, (Status.DONE, since, until))]


def run_actor(system, name, command, spec, *, timeout) -> dict:
    """Run `python -m tests.reliability.race_actors <command>` as a process of the system (its
    database, broker and oracle) with `spec` as its input; wait for it and return its JSON output."""
    return finish_actor(system, spawn_actor(system, name, command, spec), timeout=timeout)


def spawn_actor(system, name, command, spec):
    """Start an actor without waiting; `finish_actor()` collects its output."""
    spec_path = system.log_dir / f"{name}.in.json"
    spec_path.write_text(json.dumps(spec, default=str))
    (system.log_dir / f"{name}.out.json").unlink(missing_ok=True)
    return system.spawn(name, [sys.executable, "-m", "tests.reliability.race_actors", command, str(spec_path),
                               str(system.log_dir / f"{name}.out.json")])


def finish_actor(system, process, *, timeout) -> dict:
    """Wait for an actor and return its JSON output. Raises with its log's tail if it failed, or
    overran `timeout` (then it is stopped)."""
    out_path = system.log_dir / f"{process.name}.out.json"
    try:
        processes.wait_for(lambda: process.poll() is not None, timeout, interval=0.2,
                           message=f"{process.name} to finish")
    except AssertionError:
        system.stop(process)
        raise AssertionError(f"{process.name} overran {timeout} s: {system.tail(process)}") from None
    if process.returncode != 0 or not out_path.exists():
        raise AssertionError(f"{process.name} exited with {process.returncode}: {system.tail(process)}")
    system.may_exit(process)
    return json.loads(out_path.read_text())


class Stopwatch:
    def __init__(self):
        self.start = time.monotonic()
        self.laps = {}

    def lap(self, name):
        self.laps[name] = round(time.monotonic() - self.start, 1)

    def __str__(self):
        return ", ".join(f"{name} at {seconds} s" for name, seconds in self.laps.items())
