"""Races under load, continued: partition maintenance (create ahead, move rows out of
DEFAULT, drop old partitions) while tasks come due and are dispatched. Sizes scale with
TIMEOUTS_RELIABILITY_SCALE (race_tools.py); run with -s to see the lateness measured."""

from datetime import datetime, timedelta

import psycopg
import pytest

from tests.support import processes

from .oracle import check
from .race_tools import (
    MAX_DISPATCHED,
    SCALE,
    WORKER,
    Stopwatch,
    database_now,
    finish_actor,
    insert_tasks,
    lateness_summary,
    percentile,
    scaled,
    spawn_actor,
    start_lateness,
)

DDL_SECONDS = max(15.0, 20 * SCALE)  # maintenance runs round after round this long
AFTER_DDL = 15.0  # seconds more of tasks coming due: the DDL window may outrun DDL_SECONDS by a round
DUE_PER_SECOND = 40  # well under what the worker starts, so lateness measures dispatch, not a backlog
PARKED_PER_ROUND = scaled(20_000, minimum=500)  # rows parked in DEFAULT, in a past and a future bucket
DEFAULT_BALLAST = scaled(200_000, minimum=5_000)  # far-future rows that stay in DEFAULT: ATTACH scans them
P99_LIMIT = 2.0  # seconds


@pytest.mark.reliability
@pytest.mark.timeout(600)
def test_partition_maintenance_while_dispatching_loses_nothing_and_delays_little(system, oracle):
    system.extra_env["TIMEOUTS_MAX_DISPATCHED"] = MAX_DISPATCHED
    park_ballast(system.database_url, DEFAULT_BALLAST)
    worker = system.worker(**WORKER)
    system.dispatcher()
    system.scanner(interval=1)
    system.wait_worker_ready(worker)
    clock = Stopwatch()
    span = DDL_SECONDS + AFTER_DDL
    start = database_now(system.database_url) + timedelta(seconds=3)
    count = int(span * DUE_PER_SECOND)
    due = [start + timedelta(seconds=span * i / count) for i in range(count)]
    insert_tasks(system.database_url, oracle, "oracle.ok", [f"p{i}" for i in range(count)], due)
    clock.lap("scheduled")
    # Maintenance starts once tasks come due, and goes on, round after round, for DDL_SECONDS.
    processes.wait_for(lambda: database_now(system.database_url) >= start + timedelta(seconds=2), 30, interval=0.1)
    spec = {"seconds": DDL_SECONDS, "max_rounds": 60, "park_rows": PARKED_PER_ROUND}
    maintenance = finish_actor(system, spawn_actor(system, "maintenance", "maintain", spec),
                               timeout=DDL_SECONDS * 6 + 120)
    clock.lap("maintenance over")
    system.wait_until_final(timeout=span + 120)
    system.wait_broker_drained(timeout=60)
    clock.lap("all final")
    report = check(system.database_url, oracle.dsn, recovery_window=30)
    window = [datetime.fromisoformat(moment) for moment in maintenance["window"]]
    during = start_lateness(system.database_url, *window)
    before = start_lateness(system.database_url, None, window[0])
    after = start_lateness(system.database_url, window[1], None)
    rounds = maintenance["rounds"]
    print(f"\npartition maintenance while dispatching: {count} tasks due over {span:.0f} s, {DEFAULT_BALLAST} rows "
          f"kept in DEFAULT, {PARKED_PER_ROUND} parked per bucket: {clock}\n"
          f"  {len(rounds)} maintenance rounds in {(window[1] - window[0]).total_seconds():.1f} s: created "
          f"{sum(len(r['created']) for r in rounds)}, moved {sum(r['moved'] for r in rounds)} rows out of DEFAULT, "
          f"dropped {sum(len(r['dropped']) for r in rounds)}, failed steps {sum(len(r['failed']) for r in rounds)}; "
          f"round seconds {[r['seconds'] for r in rounds]}\n"
          f"  lateness (started_at - action_time) during DDL: {lateness_summary(during)}\n"
          f"  before: {lateness_summary(before)}; after: {lateness_summary(after)}\n{report}")
    for r in rounds:
        if r["failed"]:
            print(f"  round {r['round']} failed steps: {r['failed']}")
    report.assert_clean()
    assert report.counts["runs"] == count and report.counts["done"] == count
    # A step that could not get its locks in time is retried by the next run (partition_ddl): only
    # require that maintenance did each kind of work while tasks were dispatched.
    assert all(sum(bool(r[kind]) for r in rounds) >= len(rounds) / 2 for kind in ("created", "moved", "dropped"))
    assert len(during) >= DUE_PER_SECOND * 5, "too few tasks came due during the DDL to measure"
    assert percentile(during, 0.99) <= P99_LIMIT


def park_ballast(dsn, rows):
    """Finished rows 100 days ahead: beyond the partitions kept ahead, so they stay in DEFAULT, where
    every ATTACH (it locks DEFAULT) scans them."""
    with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as conn:
        conn.execute(
            "INSERT INTO timeouts_task (biz_type, biz_id, action_time, run_at, attribute, max_attempts, ttr, status, "
            "created_at, modified_at, finished_at) "
            "SELECT 'oracle.ok', 'ballast-' || n, t, t, '{}', 1, 5, 3, t, t, t "
            "FROM generate_series(1, %s) AS n, (SELECT clock_timestamp() + interval '100 days' AS t) AS due", (rows,))
        conn.execute("ANALYZE timeouts_task_default")
