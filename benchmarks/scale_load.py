"""The scale scenario's background: N PENDING tasks due over the partitions ahead, loaded as an
operator loads a table (set-based SQL, not the API), then VACUUM ANALYZEd and checkpointed, and
their size on disk.

The partitions are the project's own: maintain() creates the current bucket and PARTITIONS_AHEAD
after it (PARTITION_INTERVAL wide). The rows fall due evenly from `lead` seconds after the load
starts to the end of the last of those partitions, so none lands in DEFAULT and none falls due
while the scenario measures (scale.py checks that). Row i of N is due at start + (i - 1/2) * span / N:
the rows go in in due-time order, so each statement fills one partition (or two) and appends to its
indexes; `jobs` connections load contiguous shares of the rows side by side, each its own
partitions. Each statement inserts `chunk` rows from generate_series in a transaction of its own.

The loader's PostgreSQL backends are reniced (where the server runs here, under the same user as
the bench or root): the load shares the cores with whatever else runs on the machine.
"""

import os
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

from timeouts.conf import get_settings
from timeouts.states import Status

from .handlers import SCALE
from .progress import Progress

CHUNK = 500_000  # rows per INSERT ... SELECT
NICE = 10  # the loader's backends' niceness

INSERT = """
INSERT INTO timeouts_task (biz_type, biz_id, status, action_time, run_at, max_attempts, ttr)
SELECT %(biz_type)s, 'scale-' || i, %(pending)s, due, due, %(max_attempts)s, %(ttr)s
FROM (SELECT i, to_timestamp(%(start)s + (i - 0.5) * %(step)s) AS due
      FROM generate_series(%(first)s::bigint, %(last)s::bigint) AS i) AS rows
"""
# The task table's partitions, with their size on disk: heap (and TOAST), indexes, estimated rows.
PARTITIONS = """
SELECT c.relname, pg_table_size(c.oid), pg_indexes_size(c.oid), c.reltuples::bigint
FROM pg_inherits AS i JOIN pg_class AS c ON c.oid = i.inhrelid
WHERE i.inhparent = 'timeouts_task'::regclass ORDER BY c.relname
"""
DEFAULT_PARTITION = "timeouts_task_default"


def plan(rows: int, jobs: int, chunk: int) -> list[list[tuple[int, int]]]:
    """Each job's (first, last) row numbers, 1-based and inclusive, per statement: job j loads the
    j-th contiguous share of rows 1..rows, `chunk` at a time. Jobs without rows are left out."""
    if rows < 0 or jobs < 1 or chunk < 1:
        raise ValueError("rows >= 0, jobs >= 1 and chunk >= 1")
    share = -(-rows // jobs) if rows else 0
    out = []
    for job in range(jobs):
        first, last = job * share + 1, min(rows, (job + 1) * share)
        if first > last:
            continue
        out.append([(a, min(last, a + chunk - 1)) for a in range(first, last + 1, chunk)])
    return out


def due_window(now: datetime, lead: float, partitions_end: datetime) -> tuple[datetime, datetime]:
    """(start, end) of the background's due times: from `lead` seconds after now to the end of the
    last partition. Refused when nothing is left of it."""
    start = now + timedelta(seconds=lead)
    if start >= partitions_end:
        raise ValueError(f"the partitions end at {partitions_end.isoformat()}, before the background's first "
                         f"due time ({lead:g} s from now): lower the lead")
    return start, partitions_end


def due_time(i: int, rows: int, start: datetime, end: datetime) -> datetime:
    """When row i (1-based) of `rows` falls due: evenly over [start, end), as INSERT computes it."""
    step = (end - start).total_seconds() / rows
    return datetime.fromtimestamp(start.timestamp() + (i - 0.5) * step, tz=UTC)


def partitions_end(partitions) -> datetime:
    """The upper bound of the last range partition of maintain()'s report."""
    uppers = [p.upper for p in partitions if not p.is_default and p.upper is not None]
    if not uppers:
        raise ValueError("the task table has no range partition: run the partition maintenance first")
    return max(uppers)


def load(connect, rows: int, start: datetime, end: datetime, *, jobs: int = 1, chunk: int = CHUNK) -> dict:
    """Insert the background rows over [start, end) on `jobs` connections (`connect()` opens an
    autocommit psycopg connection); returns how long it took."""
    settings = get_settings()
    params = {"biz_type": SCALE, "pending": int(Status.PENDING), "max_attempts": settings.DEFAULT_MAX_ATTEMPTS,
              "ttr": settings.DEFAULT_TTR, "start": start.timestamp(),
              "step": (end - start).total_seconds() / rows if rows else 0.0}
    progress = Progress(f"loading {rows:,} background rows on {jobs} connection(s)", rows)
    done = [0]

    def run(statements):
        with connect() as conn:
            renice(conn)
            for first, last in statements:
                conn.execute(INSERT, {**params, "first": first, "last": last})
                done[0] += last - first + 1
                progress.update(done[0])

    started = time.perf_counter()
    _in_parallel(run, plan(rows, jobs, chunk))
    seconds = time.perf_counter() - started
    progress.finish(rows)
    return {"rows": rows, "load_s": round(seconds, 1), "load_rows_per_s": round(rows / seconds) if seconds else None,
            "load_jobs": jobs}


def vacuum_analyze(connect, conn, *, jobs: int = 1) -> dict:
    """VACUUM ANALYZE every partition, as an operator would after a bulk load, on `jobs`
    connections, then ANALYZE the parent (its own statistics cover the whole table)."""
    names = [row[0] for row in conn.execute(PARTITIONS)]
    shares = [names[j::jobs] for j in range(jobs) if names[j::jobs]]

    def run(share):
        with connect() as own:
            renice(own)
            for name in share:
                own.execute(f'VACUUM (ANALYZE) "{name}"')

    started = time.perf_counter()
    _in_parallel(run, shares)
    conn.execute("ANALYZE timeouts_task")
    return {"vacuum_s": round(time.perf_counter() - started, 1)}


def checkpoint(conn) -> dict:
    """CHECKPOINT: the load's and the vacuum's writes reach the disk now, not while the scenario
    measures (a table that has long held its rows has nothing of them left to write)."""
    started = time.perf_counter()
    conn.execute("CHECKPOINT")
    return {"checkpoint_s": round(time.perf_counter() - started, 1)}


def sizes(conn) -> dict:
    """The task table's size on disk (all partitions, heap and indexes, MB) and how many of its
    partitions hold rows (by the statistics: read after ANALYZE)."""
    parts = conn.execute(PARTITIONS).fetchall()
    heap = sum(p[1] for p in parts)
    indexes = sum(p[2] for p in parts)
    mb = 1024 * 1024
    return {"partitions": sum(1 for p in parts if p[0] != DEFAULT_PARTITION),
            "partitions_with_rows": sum(1 for p in parts if p[0] != DEFAULT_PARTITION and p[3] > 0),
            "default_rows": next((max(p[3], 0) for p in parts if p[0] == DEFAULT_PARTITION), 0),
            "heap_mb": round(heap / mb), "indexes_mb": round(indexes / mb), "total_mb": round((heap + indexes) / mb)}


def per_row_bytes(total_mb, rows) -> float | None:
    return round(total_mb * 1024 * 1024 / rows, 1) if rows and total_mb is not None else None


def renice(conn, niceness=NICE):
    """Lower the CPU priority of the connection's backend, if it is a PostgreSQL process here that
    this process may renice; else leave it as it is."""
    pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    try:
        with open(f"/proc/{pid}/comm") as f:
            if f.read().strip() != "postgres":
                return
        os.setpriority(os.PRIO_PROCESS, pid, niceness)
    except OSError:
        pass


def _in_parallel(function, shares):
    if len(shares) <= 1:
        for share in shares:
            function(share)
        return
    with ThreadPoolExecutor(max_workers=len(shares)) as pool:
        for future in [pool.submit(function, share) for share in shares]:
            future.result()
