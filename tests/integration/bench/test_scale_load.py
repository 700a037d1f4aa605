"""The scale scenario's background on a real PostgreSQL: loaded in SQL into the partitions
maintenance made, every row PENDING and due where the plan says, none in DEFAULT; then vacuumed,
analyzed and measured on disk."""

from datetime import timedelta

import psycopg
import pytest
from django.db import connection

from benchmarks import scale_load as background
from benchmarks.handlers import SCALE
from timeouts.states import Status
from timeouts.storage.partitions import maintain

pytestmark = [pytest.mark.timeout(120), pytest.mark.django_db(transaction=True)]

ROWS = 1000


def connect():
    s = connection.settings_dict
    params = {"dbname": s["NAME"], "host": s.get("HOST") or None, "port": s.get("PORT") or None,
              "user": s.get("USER") or None, "password": s.get("PASSWORD") or None}
    return psycopg.connect(**{k: v for k, v in params.items() if v is not None}, autocommit=True)


def test_the_background_is_loaded_pending_into_the_partitions_ahead_then_vacuumed_and_measured():
    report = maintain()
    with connect() as conn:
        now = conn.execute("SELECT clock_timestamp()").fetchone()[0]
        start, end = background.due_window(now, 3600, background.partitions_end(report.partitions))

        loaded = background.load(connect, ROWS, start, end, jobs=2, chunk=300)
        rows = conn.execute("SELECT biz_type, status, count(*), min(action_time), max(action_time), "
                            "bool_and(run_at = action_time), count(DISTINCT biz_id) FROM timeouts_task "
                            "GROUP BY biz_type, status").fetchall()
        in_default = conn.execute("SELECT count(*) FROM timeouts_task_default").fetchone()[0]
        vacuumed = background.vacuum_analyze(connect, conn, jobs=2)
        sizes = background.sizes(conn)

    assert loaded["rows"] == ROWS and loaded["load_s"] >= 0 and loaded["load_jobs"] == 2
    [(biz_type, status, count, first, last, run_at_is_due, keys)] = rows
    assert (biz_type, status, count, keys, run_at_is_due) == (SCALE, Status.PENDING, ROWS, ROWS, True)
    tolerance = timedelta(milliseconds=1)  # the database's and Python's floating point, in microseconds
    assert abs(first - background.due_time(1, ROWS, start, end)) < tolerance
    assert abs(last - background.due_time(ROWS, ROWS, start, end)) < tolerance
    assert in_default == 0
    assert vacuumed["vacuum_s"] >= 0
    # Every partition a row falls due in holds rows, by the statistics ANALYZE made. (The first
    # partition of the window may hold none: the rows are spaced evenly, and the window can start
    # closer to its upper bound than half a step.)
    due = [background.due_time(i, ROWS, start, end) for i in range(1, ROWS + 1)]
    holding = sum(1 for p in report.partitions
                  if not p.is_default and any(p.overlaps(t, t + timedelta(microseconds=1)) for t in due))
    assert sizes["partitions_with_rows"] == holding and sizes["default_rows"] == 0
    assert sizes["partitions"] == len(report.partitions) - 1
    assert abs(sizes["total_mb"] - sizes["heap_mb"] - sizes["indexes_mb"]) <= 1  # each rounded on its own
