"""The broker (Redis) fails under load: stopped for 15 s with its data kept, then restarted empty (every
queued and unacknowledged message gone). The test runs its own Redis (and its own PostgreSQL) and
checks with the oracle that no task is lost and none runs twice: messages that never got through are
re-dispatched once their lease runs out (the scan's lease recovery), and stale messages that come
back are dropped by the worker's compare-and-set.

Sizes follow TIMEOUTS_RELIABILITY_SCALE (1.0: 4,000 tasks, a 15 s outage). Run with -s to see what it observed; the
numbers also go to var/test-logs/reliability/<test>/numbers.json.
"""

import pytest

from tests.support.processes import wait_for
from timeouts.states import Status

from .clusters import redis_available
from .oracle import check
from .outages import ENV, WORKER, BurstScheduler, PersistentRedis, Timeline, WorkerSupervisor, scaled, sleep_checking
from .system import System

pytestmark = pytest.mark.reliability


@pytest.fixture
def persistent_redis():
    if not redis_available():
        pytest.skip("needs redis-server")
    with PersistentRedis() as server:
        yield server


@pytest.fixture
def broker_system(sut_database, persistent_redis, oracle, log_dir, monkeypatch):
    # Celery lets the CELERY_BROKER_URL environment variable (which tests/settings.py pins to the
    # tests' Redis) override even an app's explicit broker: System.app would ping the wrong server.
    monkeypatch.setenv("CELERY_BROKER_URL", persistent_redis.url(0))
    # A 10 s visibility timeout: messages a worker held when Redis went away come back within seconds
    # (stale by then), so the compare-and-set is tested on them and the broker drains before the check.
    env = {**ENV, "TIMEOUTS_TEST_VISIBILITY_TIMEOUT": 10}
    with System(database_url=sut_database.url, broker_url=persistent_redis.url(0), oracle_dsn=oracle.dsn,
                log_dir=log_dir, env=env) as sut:
        yield sut


@pytest.mark.timeout(900)
def test_redis_outage_and_restart_without_its_messages_lose_and_duplicate_nothing(
        broker_system, persistent_redis, sut_database, oracle, log_dir):
    system, redis_server = broker_system, persistent_redis
    total, outage = scaled(4_000, 300), scaled(15, 5)
    timeline = Timeline(oracle, log_dir, "redis outage + empty restart")
    workers = WorkerSupervisor(system, **WORKER)
    system.dispatcher()
    system.scanner(interval=1)
    system.wait_worker_ready(workers.current)
    workers.start()
    burst = BurstScheduler(sut_database.url, oracle.dsn, total, delay=(0.2, 2.0))
    burst.start()
    try:
        observed = _outage_then_empty_restart(system, redis_server, oracle, timeline, burst, total, outage)
    finally:
        workers.finish()
    system.wait_broker_drained(timeout=120)
    report = check(system.database_url, oracle.dsn, recovery_window=30)
    print(report)
    timeline.numbers(
        tasks=burst.committed, runs=report.counts["runs"], outage_s=outage, **observed,
        worker_restarts=workers.restarts, worker_exit_codes=workers.exit_codes,
        stale_messages_dropped=system.log_count("timeouts: dropped stale"),
        dispatcher_publish_failures=system.log_count("timeouts.dispatcher: publishing failed")
        + system.log_count("timeouts.dispatcher: the broker did not take"),
        duplicates=report.duplicate_runs, lateness=timeline.lateness(report),
    )
    report.assert_clean()  # no database fault here: no duplicate, and every attempt accounted for
    assert report.counts["jobs run"] == report.counts["committed"] == total


def _outage_then_empty_restart(system, redis_server, oracle, timeline, burst, total, outage) -> dict:
    """The two faults, while the burst runs; returns what was observed around them."""
    # 1. Redis stopped (SHUTDOWN, its append-only file kept) for `outage` seconds, then started again.
    wait_for(lambda: oracle.run_count() >= 0.25 * total, 600, interval=0.5, message="a quarter of the burst to run")
    queued_at_stop = redis_server.message_count()
    timeline.mark("stop")
    redis_server.stop_keeping_data()
    sleep_checking(system, outage)
    redis_server.start()
    timeline.mark("stop_up")
    kept = redis_server.message_count()
    stop_first_run_s = timeline.first_run_after("stop_up", 120)

    # 2. Redis killed and started empty: the claims whose messages it held must be re-dispatched.
    wait_for(lambda: oracle.run_count() >= 0.6 * total, 600, interval=0.5, message="60% of the burst to run")
    in_flight = [row[0] for row in system.query("SELECT job_id FROM timeouts_task WHERE status IN (%s, %s)",
                                                             [Status.DISPATCHED, Status.RUNNING])]
    messages_lost = redis_server.message_count()
    timeline.mark("wipe")
    redis_server.restart_empty()
    timeline.mark("wipe_up")
    wipe_first_run_s = timeline.first_run_after("wipe_up", 120)

    burst.join_checked(600)
    system.wait_until_final(timeout=900)
    return {
        "stop": {"messages_queued_at_stop": queued_at_stop, "messages_after_start": kept,
              "first_run_s": stop_first_run_s, "backlog_done_s": timeline.backlog_done_after("stop_up")},
        "empty_restart": {"messages_lost": messages_lost, "claimed_or_running_at_kill": len(in_flight),
                       "first_run_s": wipe_first_run_s,
                       "those_fired_within_s": timeline.first_runs_after(in_flight, "wipe_up"),
                       "backlog_done_s": timeline.backlog_done_after("wipe_up")},
    }
