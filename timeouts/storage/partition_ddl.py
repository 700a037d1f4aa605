"""The DDL of partition maintenance, each change in a short transaction of its own.

Locks as pg_locks shows them on PostgreSQL 15, with an open claim transaction in another session. A
claim (`claim_due`) takes ROW SHARE and ROW EXCLUSIVE on the parent and on EVERY partition, the
DEFAULT one and future ones included: the planner locks all partitions before run-time pruning. So
any lock of SHARE or stronger on any partition waits for open claims and queues later claims
behind it. What each step takes:

- CREATE TABLE .. (LIKE timeouts_task ..): ACCESS SHARE on the parent only. Conflicts with nothing.
- Moving the rows parked in DEFAULT (store/parked_rows.py: DELETE FROM the DEFAULT partition ..
  INSERT): ROW EXCLUSIVE on DEFAULT, plus the row locks of the moved rows: waits only for rows a
  claim or a cancel has locked.
- ATTACH PARTITION: SHARE UPDATE EXCLUSIVE on the parent (claims unaffected), ACCESS EXCLUSIVE on
  the new table (nobody else can see it yet), and ACCESS EXCLUSIVE on the DEFAULT partition, held
  until commit, while it scans DEFAULT for rows of the new range (longer the more rows are parked
  in DEFAULT). That lock blocks claims: they wait for it at most lock_timeout plus that scan.
  The new table is not scanned: the CHECK constraint added first proves its rows fit.
- DETACH PARTITION (non-concurrent) and DROP TABLE of an attached partition: ACCESS EXCLUSIVE on
  the parent, on the partition and on DEFAULT; no scan, so held only briefly.
  (DETACH .. CONCURRENTLY is refused while a DEFAULT partition exists.)
- DROP TABLE of a detached table: ACCESS EXCLUSIVE on that table only.

Every step runs under SET LOCAL lock_timeout = LOCK_TIMEOUT: a step that cannot get a lock quickly
gives up instead of queueing claims behind it for long, is rolled back alone, and is retried a few
times with backoff. Inside a caller's transaction (migrate) each step is a savepoint.
"""

import random
import time

from django.db import DatabaseError, transaction
from psycopg import sql

from timeouts.states import UNFINISHED, Status
from timeouts.store import parked_rows
from timeouts.store.queries import execute, fetch_one

PARENT = "timeouts_task"
LOCK_TIMEOUT = "500ms"
ATTEMPTS = 4
FIRST_BACKOFF = 0.1  # seconds, doubled after each attempt

# Errors worth another attempt, and what they mean here.
RETRYABLE = {
    "55P03": "lock timeout",  # lock_not_available: lock_timeout expired
    "40P01": "deadlock",
    "40001": "serialization failure",
    # ATTACH found rows of the new range in DEFAULT: inserted after the move, before ATTACH's lock.
    "23514": "rows arrived in DEFAULT meanwhile",
}
LOCK_TIMEOUT_SQLSTATE = "55P03"

# Put on a partition in the transaction that detaches it to be dropped (see drop_expired).
DETACHED_MARKER = "timeouts: detached to be dropped"


class StepFailed(Exception):
    """A step gave up; `lock_busy` when it was for want of a lock (later steps would wait too)."""

    def __init__(self, message, *, lock_busy=False):
        super().__init__(message)
        self.lock_busy = lock_busy


def sqlstate(exc):
    return getattr(exc.__cause__, "sqlstate", None)


def run_step(connection, step):
    """Run step(run) in its own transaction (a savepoint inside one) under a short lock_timeout.

    `run(composed_sql)` executes one composed statement. Retryable failures are retried with
    backoff; the last one, or any other database error, raises StepFailed."""
    for attempt in range(ATTEMPTS):
        try:
            with transaction.atomic(using=connection.alias):
                previous = fetch_one("current_lock_timeout", using=connection)["value"]
                execute("set_local_lock_timeout", {"value": LOCK_TIMEOUT}, using=connection).close()
                result = step(lambda statement: _run(connection, statement))
                # Inside migrate the setting would outlive this savepoint: put it back.
                execute("set_local_lock_timeout", {"value": previous}, using=connection).close()
                return result
        except DatabaseError as exc:
            code = sqlstate(exc)
            if code not in RETRYABLE:
                raise StepFailed(f"{type(exc.__cause__ or exc).__name__}: {exc}".strip()) from exc
            if attempt == ATTEMPTS - 1:
                raise StepFailed(
                    f"gave up after {ATTEMPTS} attempts ({RETRYABLE[code]}): {exc}".strip(),
                    lock_busy=code == LOCK_TIMEOUT_SQLSTATE,
                ) from exc
        time.sleep(FIRST_BACKOFF * 2**attempt * random.uniform(1, 1.5))


def _run(connection, statement):
    """Execute a composed statement. Its values are literals, so no parameters are passed (and a
    percent sign would be taken literally)."""
    with connection.cursor() as cursor:
        cursor.execute(statement.as_string(connection.connection))
        return cursor.rowcount


def _range_condition(lower, upper):
    return sql.SQL("action_time >= {} AND action_time < {}").format(sql.Literal(lower), sql.Literal(upper))


def create_partition(connection, name, lower, upper):
    """Create partition `name` for [lower, upper), moving the rows of that range out of DEFAULT.
    Returns how many rows were moved. Never CREATE TABLE .. PARTITION OF: that takes ACCESS
    EXCLUSIVE on the parent, behind every open claim."""

    def step(run):
        # INCLUDING INDEXES copies the parent's partitioned indexes; ATTACH then attaches these
        # instead of building new ones while it holds DEFAULT locked (checked with \d+: the parent's
        # indexes list the partition's ones as their children). CONSTRAINTS: ATTACH requires the
        # parent's CHECK constraints on the partition.
        run(sql.SQL(
            "CREATE TABLE {} (LIKE {} INCLUDING DEFAULTS INCLUDING CONSTRAINTS INCLUDING INDEXES)"
        ).format(sql.Identifier(name), sql.Identifier(PARENT)))
        return _fill_and_attach(connection, run, name, lower, upper)

    return run_step(connection, step)


def reattach(connection, name, lower, upper):
    """Attach a table this maintenance had detached again (it turned out to hold unfinished tasks)."""

    def step(run):
        moved = _fill_and_attach(connection, run, name, lower, upper)
        run(sql.SQL("COMMENT ON TABLE {} IS NULL").format(sql.Identifier(name)))
        return moved

    return run_step(connection, step)


def _fill_and_attach(connection, run, name, lower, upper):
    table = sql.Identifier(name)
    bounds_check = sql.Identifier(f"{name}_bounds")
    # Proves to ATTACH that every row fits the range, so it does not scan the table.
    run(sql.SQL("ALTER TABLE {} ADD CONSTRAINT {} CHECK ({})").format(
        table, bounds_check, _range_condition(lower, upper)))
    # ATTACH refuses a range for which DEFAULT still holds rows: move them first, same transaction.
    # Task rows are the store's to write: the one statement of this DDL that writes them is its.
    moved = parked_rows.move_into(name, lower, upper, using=connection)
    run(sql.SQL("ALTER TABLE {} ATTACH PARTITION {} FOR VALUES FROM ({}) TO ({})").format(
        sql.Identifier(PARENT), table, sql.Literal(lower), sql.Literal(upper)))
    # Redundant with the partition bound now; dropped so inserts do not check it twice.
    run(sql.SQL("ALTER TABLE {} DROP CONSTRAINT {}").format(table, bounds_check))
    return moved


def detach(connection, name):
    """First half of a drop: detach the partition and mark it. Once this commits nobody can write
    to the table any more (every writer goes through the parent; rows of its range now go to
    DEFAULT), so what it holds can be checked without locking claims out."""

    def step(run):
        run(sql.SQL("ALTER TABLE {} DETACH PARTITION {}").format(sql.Identifier(PARENT), sql.Identifier(name)))
        run(sql.SQL("COMMENT ON TABLE {} IS {}").format(sql.Identifier(name), sql.Literal(DETACHED_MARKER)))

    run_step(connection, step)


def drop_detached(connection, name):
    run_step(connection, lambda run: run(sql.SQL("DROP TABLE {}").format(sql.Identifier(name))))


def status_counts(connection, name) -> dict[int, int]:
    """Rows by status in one table (a partition, or a detached one)."""
    statement = sql.SQL("SELECT status, count(*) FROM {} GROUP BY status").format(sql.Identifier(name))
    with connection.cursor() as cursor:
        cursor.execute(statement.as_string(connection.connection))
        return dict(cursor.fetchall())


def unfinished_reason(counts) -> str | None:
    """Why a table with these status counts must be kept, or None if all its tasks are finished."""
    unfinished = {Status(status).label: n for status, n in sorted(counts.items()) if status in UNFINISHED and n}
    if not unfinished:
        return None
    return f"{sum(unfinished.values())} unfinished task(s): " + ", ".join(f"{k}={v}" for k, v in unfinished.items())

