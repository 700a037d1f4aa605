"""Stored Celery calls (DurableTask) in the reliability scenarios, recorded by the oracle.

- `oracle.durable`, a DurableTask that records each run first thing (task_id, the row and attempt
  its message was fenced with, the process) in the oracle's `oracle_call_run`; worker processes
  import it through `tests.reliability.settings_calls`.
- `python -m tests.reliability.durable_calls --count N --first S --window W`: stores N calls of it
  (`apply_async(eta=...)`, the caller's way), due from S to S + W seconds after it starts, in
  transactions of CHUNK, and records each committed task_id in the oracle's `oracle_call`.
  `spawn_storer(system, ...)` runs it with the system's environment, so it stores into the
  system's database; `wait_stored()` waits for it to succeed.
- `check_calls(sut_dsn, oracle_dsn)`: a CallReport of what happened to every stored call.
"""

import argparse
import os
import sys
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import psycopg

from timeouts.states import Status

from .oracle import DSN_ENV, RECORD_RETRY_SECONDS

TASK_NAME = "oracle.durable"
BIZ_TYPE = f"celery:{TASK_NAME}"
TTR = 5  # seconds: the lease of a call whose worker died runs out within seconds
CHUNK = 500

SCHEMA = """
CREATE TABLE IF NOT EXISTS oracle_call (
    task_id text PRIMARY KEY,
    stored_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS oracle_call_run (
    token uuid PRIMARY KEY,
    task_id text NOT NULL,
    job_id bigint NOT NULL,
    attempt integer NOT NULL,
    pid integer NOT NULL,
    ran_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""


def create_tables(oracle):
    oracle.conn.execute(SCHEMA)
    oracle.conn.execute("TRUNCATE oracle_call, oracle_call_run")


# -- the worker side -----------------------------------------------------------------------------

_conn = None


def _execute(sql, params):
    """On the process's own autocommit connection to the oracle, retried on connection loss."""
    global _conn
    deadline = time.monotonic() + RECORD_RETRY_SECONDS
    while True:
        try:
            if _conn is None or _conn.closed or _conn.broken:
                _conn = psycopg.connect(os.environ[DSN_ENV], autocommit=True, connect_timeout=5)
            _conn.execute(sql, params)
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            _conn = None
            time.sleep(0.2)


def record_run(task_id, fence):
    job_id, attempt = fence.job_id, fence.attempt
    _execute("INSERT INTO oracle_call_run (token, task_id, job_id, attempt, pid) VALUES (%s, %s, %s, %s, %s) "
             "ON CONFLICT (token) DO NOTHING", (str(uuid.uuid4()), task_id, job_id, attempt, os.getpid()))


def define_task():
    """The task, on the app Celery considers current (the project's, in a worker)."""
    from celery import shared_task

    from timeouts.celery import DurableTask
    from timeouts.protocol import FENCE_HEADER, from_header

    @shared_task(base=DurableTask, bind=True, name=TASK_NAME, ttr=TTR)
    def durable(self, n):
        record_run(self.request.id, from_header((self.request.headers or {})[FENCE_HEADER]))
        return n

    return durable


# -- the caller side -----------------------------------------------------------------------------

def store(count, first, window):
    import django

    django.setup()
    from django.db import transaction

    from project.celery import app  # noqa: F401  (the app the task binds to)

    task = define_task()
    oracle = psycopg.connect(os.environ[DSN_ENV], autocommit=True)
    start = datetime.now(UTC) + timedelta(seconds=first)
    for offset in range(0, count, CHUNK):
        ids = []
        with transaction.atomic():
            # Never due by the time it is stored (a loaded machine stores slowly): a call already due
            # would go to the broker as Celery sends it, not through its row.
            soonest = datetime.now(UTC) + timedelta(seconds=1)
            for n in range(offset, min(offset + CHUNK, count)):
                eta = max(start + timedelta(seconds=window * n / count), soonest)
                ids.append(task.apply_async((n,), eta=eta).id)
        with oracle.cursor() as cursor:  # committed: recorded
            cursor.executemany("INSERT INTO oracle_call (task_id) VALUES (%s)", [(i,) for i in ids])
    oracle.close()


def spawn_storer(system, count, *, first, window):
    args = ["--count", count, "--first", first, "--window", window]
    return system.may_exit(system.spawn("storer", [sys.executable, "-m", "tests.reliability.durable_calls",
                                                   *map(str, args)]))


def wait_stored(system, storer, timeout):
    from tests.support.processes import wait_for

    wait_for(lambda: storer.poll() is not None, timeout, interval=0.2, message="the calls to be stored")
    assert storer.returncode == 0, system.tail(storer)


def call_runs(oracle) -> int:
    return oracle.conn.execute("SELECT count(*) FROM oracle_call_run").fetchone()[0]


def main(argv=None):
    parser = argparse.ArgumentParser(description="store DurableTask calls and record them in the oracle")
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--first", type=float, required=True, help="seconds to the first call's eta")
    parser.add_argument("--window", type=float, required=True, help="seconds over which the calls fall due")
    args = parser.parse_args(argv)
    store(args.count, args.first, args.window)
    return 0


# -- the check -----------------------------------------------------------------------------------

@dataclass
class CallReport:
    stored: int = 0
    runs: int = 0
    lost: list = field(default_factory=list)  # task ids that never ran
    unexpected: list = field(default_factory=list)  # task ids that ran but were not stored
    early: list = field(default_factory=list)  # (task_id, seconds early)
    double_starts: list = field(default_factory=list)  # (task_id, attempt): one attempt started twice
    duplicates: dict = field(default_factory=dict)  # task_id -> its runs, oldest first, if more than one
    not_done: list = field(default_factory=list)  # (task_id, status)
    accounting: list = field(default_factory=list)  # (task_id, attempts, runs)
    due: dict = field(default_factory=dict)  # task_id -> its action_time, for every stored call's row

    def problems(self) -> dict:
        names = ("lost", "unexpected", "early", "double_starts", "duplicates", "not_done", "accounting")
        return {name: getattr(self, name) for name in names if getattr(self, name)}

    def __str__(self):
        lines = [f"calls: {self.stored} stored, {self.runs} runs"]
        for name, items in self.problems().items():
            shown = list(items.items()) if isinstance(items, dict) else items
            lines.append(f"  {name}: {len(items)}: {shown[:5]}{' ...' if len(items) > 5 else ''}")
        return "\n".join(lines if self.problems() else [*lines, "  no problems"])

    def unstarted(self) -> list:
        """Attempts that counted (the compare-and-set committed) and never reached the task's first line:
        their process died in between."""
        return [entry for entry in self.accounting if entry[2] < entry[1]]

    def excused_duplicates(self, died_mid_run) -> list:
        """Calls that ran again after a first run in a process that died (before its outcome was
        recorded, or the call would not have run again)."""
        return [task_id for task_id, runs in self.duplicates.items() if runs[0]["pid"] in died_mid_run]

    def assert_clean(self, *, died_mid_run=()):
        """No call lost, early, unexpected or left unfinished. If worker processes died (their pids in
        `died_mid_run`), a call may have run twice when its first run was in one of them, and an
        attempt may have counted without a run; else neither."""
        problems = dict(self.problems())
        if died_mid_run:
            if set(self.duplicates) <= set(self.excused_duplicates(died_mid_run)):
                problems.pop("duplicates", None)
            if set(self.accounting) <= set(self.unstarted()):
                problems.pop("accounting", None)
        assert not problems, f"broken guarantees of stored calls: {sorted(problems)}\n{self}"


def without_calls(report, sut_dsn):
    """The oracle's Report (checker.py) of the handlers' tasks alone: it reads every row of
    timeouts_task, and the stored calls' rows (checked by check_calls) have no runs in oracle_run."""
    with psycopg.connect(sut_dsn, connect_timeout=10) as sut:
        calls = {job_id for (job_id,) in sut.execute("SELECT job_id FROM timeouts_task WHERE biz_type = %s",
                                                      [BIZ_TYPE])}
    for name in ("stuck", "accounting"):
        setattr(report, name, [entry for entry in getattr(report, name) if entry[0] not in calls])
    return report


def check_calls(sut_dsn, oracle_dsn) -> CallReport:
    with psycopg.connect(sut_dsn, connect_timeout=10) as sut:
        rows = {}
        for task_id, status, action_time, attempts in sut.execute(
                "SELECT biz_id, status, action_time, attempts FROM timeouts_task WHERE biz_type = %s", [BIZ_TYPE]):
            rows[task_id] = (status, action_time, attempts)
    with psycopg.connect(oracle_dsn, connect_timeout=10, row_factory=psycopg.rows.dict_row) as oracle:
        stored = {row["task_id"] for row in oracle.execute("SELECT task_id FROM oracle_call")}
        runs = oracle.execute("SELECT * FROM oracle_call_run ORDER BY ran_at").fetchall()
    by_task = defaultdict(list)
    for run in runs:
        by_task[run["task_id"]].append(run)
    report = CallReport(stored=len(stored), runs=len(runs),
                        due={task_id: action_time for task_id, (_, action_time, _) in rows.items()})
    report.lost = sorted(stored - set(by_task))
    report.unexpected = sorted(set(by_task) - stored)
    for task_id, task_runs in by_task.items():
        status, action_time, attempts = rows.get(task_id, (None, None, 0))
        if action_time is not None and task_runs[0]["ran_at"] < action_time:
            report.early.append((task_id, (action_time - task_runs[0]["ran_at"]).total_seconds()))
        report.double_starts += [(task_id, attempt) for attempt, n in
                                 Counter(run["attempt"] for run in task_runs).items() if n > 1]
        if len(task_runs) > 1:
            report.duplicates[task_id] = task_runs
        if len(task_runs) != attempts:
            report.accounting.append((task_id, attempts, len(task_runs)))
    report.not_done = sorted((task_id, status) for task_id, (status, *_rest) in rows.items() if status != Status.DONE)
    return report


if __name__ == "__main__":
    sys.exit(main())
