"""The oracle: what was scheduled, cancelled and run, recorded OUTSIDE the system under test (in a
database of its own on the shared cluster), so no fault of the system's database can lose it.

Three writers, one table each (see SCHEMA):

- the test, scheduling through `Scheduler` (a psycopg connection to the system's database, the
  library's own `insert_task`/`cancel_task` queries): every job id with its transaction's outcome,
  `committed`, `rolled_back` or `unknown` (the connection died during COMMIT), and every cancel with
  its result (True, False, or None when unknown);
- every handler run, through `record_run(task)` (tests/testapp/oracle_handlers.py calls it first
  thing): job id, attempt, the task's action_time/run_at/started_at, the oracle's clock_timestamp()
  and the pid, on an autocommit connection of the handler process's own (DSN from the environment
  variable TIMEOUTS_ORACLE_DSN), retried on connection loss;
- `check(sut_dsn, oracle_dsn, recovery_window=...)` (tests/reliability/checker.py) reads both
  databases and returns a Report of every broken guarantee.

Typical use in a scenario (fixtures from tests/reliability/conftest.py):

    scheduler = Scheduler(sut.url, oracle)
    job_ids = scheduler.schedule_many([{"biz_type": "oracle.ok", "biz_id": i, "delay": 1} for i in range(50)])
    scheduler.cancel(job_ids[0])
    ... run the system, inject faults, wait until final ...
    report = check(sut.url, oracle.dsn, recovery_window=10)
    report.assert_clean()
"""

import os
import time
import uuid

import psycopg

from .checker import Report, check  # noqa: F401  (the oracle's public API)

DSN_ENV = "TIMEOUTS_ORACLE_DSN"
RECORD_RETRY_SECONDS = 60.0

SCHEMA = """
CREATE TABLE IF NOT EXISTS oracle_scheduled (
    job_id bigint NOT NULL,
    biz_type text NOT NULL,
    biz_id text NOT NULL,
    outcome text NOT NULL CHECK (outcome IN ('committed', 'rolled_back', 'unknown')),
    recorded_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS oracle_cancel (
    job_id bigint NOT NULL,
    result boolean,  -- NULL: unknown (the cancel's connection failed)
    cancelled_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS oracle_run (
    token uuid PRIMARY KEY,  -- one per record_run() call: a retried insert cannot count twice
    job_id bigint NOT NULL,
    attempt integer NOT NULL,
    action_time timestamptz NOT NULL,  -- the task's, as the worker's compare-and-set returned it
    run_at timestamptz NOT NULL,
    started_at timestamptz,  -- the compare-and-set's time (the system's database clock)
    ran_at timestamptz NOT NULL DEFAULT clock_timestamp(),  -- the oracle's clock (same machine)
    pid integer NOT NULL,
    intent text NOT NULL DEFAULT 'ok'  -- 'ok', or 'raise'/'crash': the handler fails on purpose
);
"""
TABLES = ("oracle_scheduled", "oracle_cancel", "oracle_run")


# -- the handler side (runs in worker processes) ------------------------------------------------

_conn = None


def record_run(task, intent="ok"):
    """Record one handler start. `intent`: 'raise' or 'crash' when the handler will fail on purpose
    (a retry after it is then no duplicate)."""
    global _conn
    params = (str(uuid.uuid4()), task.job_id, task.attempts, task.action_time, task.run_at, task.started_at,
              os.getpid(), intent)
    deadline = time.monotonic() + RECORD_RETRY_SECONDS
    while True:
        try:
            if _conn is None or _conn.closed or _conn.broken:
                _conn = psycopg.connect(os.environ[DSN_ENV], autocommit=True, connect_timeout=5)
            _conn.execute(
                "INSERT INTO oracle_run (token, job_id, attempt, action_time, run_at, started_at, pid, intent) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (token) DO NOTHING", params)
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            _close()
            time.sleep(0.2)


def _close():
    global _conn
    if _conn is not None:
        _conn.close()
        _conn = None


# -- the test side ------------------------------------------------------------------------------

class Oracle:
    """The test's handle on the oracle database: create/empty its tables, record, read."""

    def __init__(self, dsn):
        self.dsn = dsn
        self.conn = psycopg.connect(dsn, autocommit=True)

    def create_tables(self):
        self.conn.execute(SCHEMA)

    def reset(self):
        self.conn.execute(f"TRUNCATE {', '.join(TABLES)}")

    def close(self):
        self.conn.close()

    def record_scheduled(self, jobs, outcome):
        """jobs: [(job_id, biz_type, biz_id)]."""
        with self.conn.cursor() as cursor:
            cursor.executemany("INSERT INTO oracle_scheduled (job_id, biz_type, biz_id, outcome) "
                               "VALUES (%s, %s, %s, %s)",
                               [(*job, outcome) for job in jobs])

    def record_cancel(self, job_id, result):
        self.conn.execute("INSERT INTO oracle_cancel (job_id, result) VALUES (%s, %s)", (job_id, result))

    def runs(self, job_id=None) -> list[dict]:
        where, params = ("WHERE job_id = %s", [job_id]) if job_id is not None else ("", [])
        with self.conn.cursor(row_factory=psycopg.rows.dict_row) as cursor:
            return cursor.execute(f"SELECT * FROM oracle_run {where} ORDER BY ran_at", params).fetchall()

    def run_count(self, since=None) -> int:
        """Handler runs recorded (since an oracle timestamp, e.g. `self.now()`, if given)."""
        sql, params = "SELECT count(*) FROM oracle_run", []
        if since is not None:
            sql, params = sql + " WHERE ran_at >= %s", [since]
        return self.conn.execute(sql, params).fetchone()[0]

    def now(self):
        return self.conn.execute("SELECT clock_timestamp()").fetchone()[0]


class Scheduler:
    """Schedules and cancels on the system's database and records every outcome in the oracle."""

    def __init__(self, sut_dsn, oracle: Oracle):
        self.sut_dsn, self.oracle = sut_dsn, oracle
        self.conn = None

    def _connection(self):
        if self.conn is None or self.conn.closed or self.conn.broken:
            self.conn = psycopg.connect(self.sut_dsn, connect_timeout=5)
        return self.conn

    def close(self):
        if self.conn is not None:
            self.conn.close()

    def schedule(self, biz_type, biz_id, **kwargs) -> int:
        return self.schedule_many([{"biz_type": biz_type, "biz_id": biz_id, **kwargs}])[0]

    def schedule_many(self, items, *, rollback=False) -> list[int]:
        """Insert every item (dicts of prepare()'s arguments: biz_type, biz_id, at or delay,
        attribute) in one transaction, then commit (or roll back); returns the job ids.

        A failure before COMMIT records the ids inserted so far as rolled back; a failure of COMMIT
        itself records them as unknown (check() decides by looking at the system's table). Either
        way the error is raised again."""
        from timeouts.store.queries import fetch_one
        from timeouts.store.scheduling import prepare

        jobs = []
        conn = self._connection()
        try:
            for item in items:
                item = dict(item)
                new = prepare(item.pop("biz_type"), item.pop("biz_id"), **item)
                row = fetch_one("insert_task", new.params(), using=conn)
                jobs.append((row["job_id"], new.biz_type, new.biz_id))
        except BaseException:
            self._rollback(conn)
            self.oracle.record_scheduled(jobs, "rolled_back")
            raise
        if rollback:
            conn.rollback()
            self.oracle.record_scheduled(jobs, "rolled_back")
            return [job[0] for job in jobs]
        try:
            conn.commit()
        except BaseException:
            self.oracle.record_scheduled(jobs, "unknown")
            raise
        self.oracle.record_scheduled(jobs, "committed")
        return [job[0] for job in jobs]

    def cancel(self, job_id) -> bool:
        """task.cancel() for one job id: True only if the handler will never run. Recorded, also
        when it fails (result unknown, then the error is raised again)."""
        from timeouts.store.queries import fetch_one

        conn = self._connection()
        try:
            result = False
            for _ in range(3):  # follow the row if a reschedule moved it to another partition
                current = fetch_one("find_task", {"job_id": job_id}, using=conn)
                if current is None or current["status"] not in (0, 1, 5):
                    break
                params = {"job_id": job_id, "action_time": current["action_time"]}
                if fetch_one("cancel_task", params, using=conn) is not None:
                    result = True
                    break
            conn.commit()
        except BaseException:
            self._rollback(conn)
            self.oracle.record_cancel(job_id, None)
            raise
        self.oracle.record_cancel(job_id, result)
        return result

    @staticmethod
    def _rollback(conn):
        try:
            conn.rollback()
        except psycopg.Error:
            pass  # the connection is gone: the server rolls back by itself
