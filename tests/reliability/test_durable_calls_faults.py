"""Stored Celery calls (DurableTask) through a worker killed with SIGKILL: 5,000 calls stored ahead,
falling due over 15 s (~330 a second); halfway through, the whole worker (main process and pool) is killed and a new
one started. The oracle (tests/reliability/durable_calls.py) counts the runs of every task_id: none
is lost, none starts early, and none runs twice unless its first run was in the killed worker,
before its outcome was recorded (at least once: a worker that dies mid-run), so at most one per
thread of the killed pool. An attempt may also count without a run: a pool process that died
between its compare-and-set and the task's first line, or a call whose start the killed worker's
main process had recorded ahead of its eta (timeouts.durable.starts): such a call runs once its lease
runs out, and it was due no later than START_AHEAD after the kill. Messages the killed worker had
taken come back from Redis after a 10 s visibility timeout, stale by then: the compare-and-set
drops them.

Sizes follow TIMEOUTS_RELIABILITY_SCALE (the rate stays: more calls fall due over longer). Numbers go
to var/test-logs/reliability/<test>/numbers.json.
"""

import signal
import time

import pytest

from tests.support.processes import wait_for
from timeouts.durable.starts import START_AHEAD
from timeouts.states import Status

from .durable_calls import BIZ_TYPE, call_runs, check_calls, create_tables, spawn_storer, wait_stored
from .outages import ENV, WORKER, Timeline
from .race_tools import scaled, timeout_for
from .system import System

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

SETTINGS = "tests.reliability.settings_calls"


def unfinished_calls(system) -> int:
    return system.query("SELECT count(*) FROM timeouts_task WHERE biz_type = %s AND status <> %s",
                        [BIZ_TYPE, Status.DONE])[0][0]


@pytest.fixture
def calls_system(sut_database, broker_url, oracle, log_dir):
    create_tables(oracle)
    env = {**ENV, "DJANGO_SETTINGS_MODULE": SETTINGS, "TIMEOUTS_TEST_VISIBILITY_TIMEOUT": 10}
    with System(database_url=sut_database.url, broker_url=broker_url, oracle_dsn=oracle.dsn, log_dir=log_dir,
                env=env) as sut:
        yield sut


@pytest.mark.timeout(timeout_for(240))
def test_a_worker_killed_with_thousands_of_calls_pending_loses_none_and_runs_none_twice(calls_system, oracle,
                                                                                         log_dir):
    system = calls_system
    count = scaled(5_000, 500)
    window = max(5.0, 30.0 * count / 10_000)  # seconds over which they fall due: ~330 calls/s
    timeline = Timeline(oracle, log_dir, f"worker SIGKILL with {count:,} calls pending")
    worker = system.worker(**WORKER)
    system.dispatcher()
    system.scanner(interval=1)
    system.wait_worker_ready(worker)
    started = time.monotonic()
    # The first call due 10 s after the storer starts: every call is stored (in about a second per
    # 3,000) before any is due.
    wait_stored(system, spawn_storer(system, count, first=10, window=window), 120)
    stored_s = round(time.monotonic() - started, 1)

    wait_for(lambda: call_runs(oracle) >= count // 2, 180, interval=0.2, message="half of the calls to run")
    killed = [worker.pid, *system.children(worker)]
    system.may_exit(worker)
    timeline.mark("kill")
    for pid in killed:
        system.kill(pid, signal.SIGKILL)
    runs_at_kill = call_runs(oracle)
    wait_for(lambda: system.all_gone(killed), 10, message="the killed worker's processes to be gone")
    # By the database clock, which decided every start recorded ahead: all of them came before this.
    killed_at = system.query("SELECT now()")[0][0]
    time.sleep(1)
    replacement = system.worker("replacement", **WORKER)
    system.wait_worker_ready(replacement)
    restarted = time.monotonic()

    wait_for(lambda: unfinished_calls(system) == 0, timeout_for(120, 60), interval=0.5,
             message="every call to be DONE")
    done_s = round(time.monotonic() - restarted, 1)
    system.wait_broker_drained(60)
    report = check_calls(system.database_url, oracle.dsn)
    print(report)
    timeline.numbers(calls=count, window_s=window, stored_in_s=stored_s, runs_at_kill=runs_at_kill,
                     runs=report.runs, ran_twice=len(report.duplicates), unstarted_attempts=len(report.unstarted()),
                     stale_messages_dropped=system.log_count("timeouts: dropped a stale message"),
                     all_done_after_restart_s=done_s)
    report.assert_clean(died_mid_run=killed)
    assert report.stored == count
    # Each thread of the killed pool held at most one call between its compare-and-set and its end.
    assert len(report.duplicates) <= WORKER["concurrency"]
    # An attempt that counted without a run was in the killed pool, or started ahead by the killed
    # worker's main process: a start is recorded at most START_AHEAD before the call's due time.
    due_after = [task_id for task_id, *_counts in report.unstarted()
                 if (report.due[task_id] - killed_at).total_seconds() > START_AHEAD]
    assert not due_after, f"attempts counted without a run, due over {START_AHEAD} s after the kill: {due_after}"
