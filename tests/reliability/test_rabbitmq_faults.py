"""RabbitMQ (Celery's default broker) fails under load: a node of its own (rabbitmq_node.py) is stopped
cleanly for 20 s, then, later, killed (SIGKILL) and started again at once, while timeouts tasks
(oracle.ok, through the dispatcher and the scan) and stored Celery calls (DurableTask, oracle.durable)
fall due. Publisher confirms are on (`timeouts.celery.setup()`): a message the node did not confirm
fails its publish, and its claim is released and published again once the node is back; a message
it confirmed was on disk (durable queue, persistent message) and survives both faults. The node
redelivers the messages a worker had not acknowledged when its connection dropped; stale by then,
the compare-and-set drops them. A run may be repeated only if its process died mid-run: Celery kills
pool processes whose task overran its hard time limit while the node was away (2-6 per run), and a
worker exited once in 7 runs (Celery 5.7, restarted by the supervisor); none of their runs was
repeated in those runs.

Sizes follow TIMEOUTS_RELIABILITY_SCALE (1.0: 3,000 tasks scheduled over 40 s, 1,000 calls due over
60 s, a 20 s stop, and 600 more tasks scheduled over 10 s from just before the kill, so that tasks
fall due across it however long the stop and its backlog took). Run with -s to see what it
observed; the numbers also go to var/test-logs/reliability/<test>/numbers.json.
"""

import os
import signal
import time
from contextlib import contextmanager, suppress

import psutil
import pytest

from tests.support.processes import wait_for

from .durable_calls import call_runs, check_calls, create_tables, spawn_storer, wait_stored, without_calls
from .oracle import check
from .outages import ENV, BurstScheduler, Timeline, WorkerSupervisor, scaled, sleep_checking
from .rabbitmq_node import ThrowawayRabbitMQ, rabbitmq_server_available
from .race_tools import timeout_for
from .system import System

pytestmark = [pytest.mark.reliability, pytest.mark.slow]

SETTINGS = "tests.reliability.settings_calls"
SPREAD = 40.0  # seconds over which the tasks are scheduled
CRASH_SPREAD = 10.0  # seconds over which the tasks scheduled from the kill are
CALLS_WINDOW = 60.0  # seconds over which the calls fall due: past the stop, into the kill
# Prefork, as in most deployments. With Celery's prefetch reduction after a reconnect on, a `-P threads`
# worker could reconnect after a restart of the node and then consume nothing; timeouts.celery.setup()
# turns it off (timeouts/worker/reconnect_prefetch.py).
POOL = {"pool": "prefork", "concurrency": 4}


@contextmanager
def stacks_if_nothing_runs(workers):
    """A wait for runs that times out leaves, in worker.log, the stack of every thread of the worker's
    main process (Celery's SIGUSR1 handler): a worker that reconnected and then took nothing
    (a busy machine can bring that about) shows where it waits."""
    try:
        yield
    except AssertionError:
        with suppress(ProcessLookupError):
            os.kill(workers.current.pid, signal.SIGUSR1)
            time.sleep(2)
        raise


def gone(oracle) -> set:
    """The processes that recorded a run (of a task or a call) and are not alive any more: pool
    processes Celery killed at their task's hard time limit, or a worker that exited. Asked before
    the workers are stopped, these are the processes that may have died mid-run."""
    pids = {pid for (pid,) in oracle.conn.execute("SELECT pid FROM oracle_run UNION SELECT pid FROM oracle_call_run")}
    return {pid for pid in pids if not psutil.pid_exists(pid)}


@pytest.fixture
def rabbitmq_node(log_dir):
    if not rabbitmq_server_available():
        pytest.skip("needs RabbitMQ's rabbitmq-server and rabbitmqctl (/usr/lib/rabbitmq/bin)")
    with ThrowawayRabbitMQ(log_dir) as node:
        yield node


@pytest.fixture
def rabbitmq_system(sut_database, rabbitmq_node, oracle, log_dir, monkeypatch):
    # Celery reads CELERY_BROKER_URL (pinned to the tests' Redis by tests/settings.py) before an
    # app's own broker: System.app would ping the wrong server.
    monkeypatch.setenv("CELERY_BROKER_URL", rabbitmq_node.url)
    create_tables(oracle)
    env = {**ENV, "DJANGO_SETTINGS_MODULE": SETTINGS}
    with System(database_url=sut_database.url, broker_url=rabbitmq_node.url, oracle_dsn=oracle.dsn,
                log_dir=log_dir, env=env) as sut:
        yield sut


@pytest.mark.timeout(timeout_for(300, 240))
def test_a_rabbitmq_node_stopped_then_killed_under_load_loses_and_duplicates_nothing(
        rabbitmq_system, rabbitmq_node, sut_database, oracle, log_dir):
    system, node = rabbitmq_system, rabbitmq_node
    total, calls, outage = scaled(3_000, 300), scaled(1_000, 100), scaled(20, 5)
    crash_total = scaled(600, 60)
    timeline = Timeline(oracle, log_dir, "rabbitmq stop + kill")
    workers = WorkerSupervisor(system, **POOL)
    system.dispatcher()
    system.scanner(interval=1)
    system.wait_worker_ready(workers.current)
    workers.start()
    burst = BurstScheduler(sut_database.url, oracle.dsn, total, delay=(0.2, 2.0), rate=total / SPREAD)
    burst.start()
    storer = spawn_storer(system, calls, first=2, window=CALLS_WINDOW)
    try:
        # 1. A clean stop: the node is gone for `outage` seconds, then starts with its messages.
        wait_for(lambda: oracle.run_count() >= 0.2 * total, 300, interval=0.5, message="a fifth of the tasks to run")
        timeline.mark("stop")
        node.stop()
        sleep_checking(system, outage)
        node.start()
        timeline.mark("stop_up")
        with stacks_if_nothing_runs(workers):
            stop_first_run_s = timeline.first_run_after("stop_up", 120)

        # 2. A crash: killed, and started again at once.
        wait_for(lambda: oracle.run_count() >= 0.6 * total and call_runs(oracle) >= 0.5 * calls, 300, interval=0.5,
                 message="60% of the tasks and half of the calls to run")
        call_runs_at_kill, task_runs_at_kill = call_runs(oracle), oracle.run_count()
        # On a slow machine the stop and its backlog can outlast the first burst, which has then run
        # to its end: tasks scheduled from here fall due across the crash, so there is a run to wait for.
        crash_burst = BurstScheduler(sut_database.url, oracle.dsn, crash_total, delay=(0.2, 2.0),
                                     rate=crash_total / CRASH_SPREAD, prefix="crash")
        crash_burst.start()
        timeline.mark("kill")
        node.kill()
        node.start()
        timeline.mark("kill_up")
        with stacks_if_nothing_runs(workers):
            kill_first_run_s = timeline.first_run_after("kill_up", 120)

        wait_stored(system, storer, 300)
        burst.join_checked(600)
        crash_burst.join_checked(600)
        system.wait_until_final(timeout=600)
        died = gone(oracle)
    finally:
        workers.finish()
    node.wait_drained(120)
    report = without_calls(check(system.database_url, oracle.dsn, recovery_window=30), system.database_url)
    calls_report = check_calls(system.database_url, oracle.dsn)
    print(report)
    print(calls_report)
    timeline.numbers(
        tasks=burst.committed + crash_burst.committed, runs=report.counts["runs"], calls=calls_report.stored,
        call_runs=calls_report.runs, task_runs_at_kill=task_runs_at_kill, call_runs_at_kill=call_runs_at_kill,
        outage_s=outage, stop_first_run_s=stop_first_run_s,
        stop_backlog_done_s=timeline.backlog_done_after("stop_up"), kill_first_run_s=kill_first_run_s,
        kill_backlog_done_s=timeline.backlog_done_after("kill_up"),
        worker_restarts=workers.restarts, worker_exit_codes=workers.exit_codes,
        processes_gone=len(died),
        stale_messages_dropped=system.log_count("timeouts: dropped stale")
        + system.log_count("timeouts: dropped a stale message"),
        dispatcher_publish_failures=system.log_count("timeouts.dispatcher: publishing failed")
        + system.log_count("timeouts.dispatcher: the broker did not take"),
        lateness=timeline.lateness(report),
    )
    # A run may be repeated only if its process died mid-run: Celery may kill a pool process whose
    # task overran its hard time limit while the node was away, or a worker may exit (the supervisor
    # starts another). Each of those processes had at most one run in flight.
    report.assert_clean(max_duplicates=len(died))
    calls_report.assert_clean(died_mid_run=died)
    assert len(report.duplicates) + len(calls_report.duplicates) <= len(died)
    assert report.counts["jobs run"] == report.counts["committed"] == total + crash_total
    assert calls_report.stored == calls
