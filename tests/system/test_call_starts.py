"""A DurableTask call claimed ahead is started by the worker's main process while its message
waits for its eta: real worker processes, a real dispatcher process, the real broker (Redis)."""

import signal
import time
from contextlib import contextmanager
from datetime import UTC, datetime

import pytest
from django.db import connection
from django.test import override_settings
from django.urls import path
from prometheus_client.parser import text_string_to_metric_families

import timeouts.celery
from tests.support import processes
from tests.support.brokers import drop_connections
from tests.system.test_dispatcher import dispatcher_process
from tests.system.test_durable_task import calls, cancel_racing_due_times, settled
from tests.testapp import tasks
from timeouts import metrics
from timeouts.models import TimeoutTask

Status = TimeoutTask.Status
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# Well inside call_starts.START_AHEAD: the worker holds each message this long before its eta.
LEAD = "0.8"
# Seconds the slow calls keep every pool process busy: from before a call's eta to well after it.
BUSY_FOR = 1.5
# Seconds a slow call holds a worker's one pool process, while a call of a 1 s lease started ahead
# waits for it from its eta on, well past its lease.
HOLDS_THE_PROCESS = 6
urlpatterns = [path("metrics/timeouts", metrics.metrics_view)]


def started_before_due() -> int:
    """Calls RUNNING while their run_at is still a while off, by the database clock (a pool process
    records its own start at most publishing.ETA_HEADROOM ahead)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM timeouts_task WHERE biz_type LIKE 'celery:%%' "
                       "AND status = %s AND run_at > clock_timestamp() + interval '0.2 second'",
                       [int(Status.RUNNING)])
        return cursor.fetchone()[0]


@pytest.mark.timeout(90)
def test_a_call_is_started_while_its_message_waits_and_runs_at_its_eta(worker, runs):
    with dispatcher_process("dispatcher", "--lead", LEAD):
        results = [tasks.record.apply_async((i,), countdown=2 + i / 5) for i in range(5)]
        processes.wait_for(lambda: started_before_due() > 0, 30, interval=0.01,
                           message="a call started before its eta")
        processes.wait_for(lambda: runs.count() == 5 and settled(), 30, message="every call")
    time.sleep(0.5)  # a duplicate would show now
    rows = {row.biz_id: row for row in calls()}
    assert sorted(r[0] for r in runs.all()) == sorted(r.id for r in results)
    assert all(started_at >= rows[task_id].action_time for task_id, *_, started_at in runs.all())
    assert {(row.status, row.attempts) for row in rows.values()} == {(Status.DONE, 1)}


@pytest.mark.timeout(90)
def test_a_stopping_worker_gives_back_the_calls_it_started_ahead(worker, runs):
    with dispatcher_process("dispatcher", "--lead", LEAD):
        result = tasks.record.apply_async(("given back",), countdown=3)
        processes.wait_for(lambda: started_before_due() == 1, 30, interval=0.01,
                           message="the call started before its eta")
        worker.send_signal(signal.SIGTERM)  # a warm shutdown, before the eta
        worker.wait(30)
        assert runs.count() == 0
        # Given back, then claimed and published again by the dispatcher: no lease to wait out.
        assert calls().get().status in (Status.PENDING, Status.DISPATCHED)
        replacement = processes.celery_worker(env=processes.django_env(), name="replacement")
        try:
            processes.wait_for(lambda: settled() and runs.count() == 1, 30, message="the call, once")
            time.sleep(1)  # the message the stopped worker held, delivered again, is dropped
        finally:
            processes.stop(replacement)
    assert [r[0] for r in runs.all()] == [result.id]
    row = calls().get()
    assert (row.status, row.attempts, row.last_error) == (Status.DONE, 1, "")


@pytest.mark.timeout(90)
def test_a_worker_that_loses_its_broker_connection_gives_back_the_calls_it_started_ahead(worker, runs, broker):
    """On a lost connection Celery drops the messages it holds for their eta (they cannot be
    acknowledged on a new one). Their starts are given back, as at a shutdown: the call runs at
    once, with its attempt unused, rather than once its lease runs out."""
    with dispatcher_process("dispatcher", "--lead", LEAD):
        result = tasks.record.apply_async(("connection lost",), countdown=3)
        processes.wait_for(lambda: started_before_due() == 1, 30, interval=0.01,
                           message="the call started before its eta")
        drop_connections(broker)
        assert runs.count() == 0
        processes.wait_for(lambda: settled() and runs.count() == 1, 20, message="the call, once, within its lease")
        time.sleep(1)  # a duplicate would show now
    assert [r[0] for r in runs.all()] == [result.id]
    row = calls().get()
    assert (row.status, row.attempts, row.last_error) == (Status.DONE, 1, "")


@pytest.mark.timeout(120)
def test_a_true_cancel_racing_a_start_ahead_never_runs(worker, runs):
    with dispatcher_process("dispatcher", "--lead", "0.2"):
        # Every other call, from before its claim to after its due time, while it is claimed,
        # published, held by the worker, started ahead and run.
        cancel_racing_due_times(runs, lead=3, offsets=[-0.4, -0.2, -0.15, -0.1, -0.05, -0.01, 0.0, 0.01])


@pytest.mark.timeout(90)
@override_settings(ROOT_URLCONF=__name__)
def test_a_call_started_ahead_that_waits_for_a_process_counts_its_true_lateness(client, broker, runs, tmp_path,
                                                                                  monkeypatch):
    """Its start is recorded ahead as at run_at, but its body starts only when a process frees: that
    later time is its lateness, in the metrics at once and on its row once it has ended."""
    with processes.running_worker(env=processes.django_env(PROMETHEUS_MULTIPROC_DIR=tmp_path), name="busy-worker"):
        with dispatcher_process("dispatcher", "--lead", LEAD):
            tasks.record.apply_async(("late",), countdown=2)
            processes.wait_for(lambda: started_before_due() == 1, 30, interval=0.01,
                               message="the call started before its eta")
            for _ in range(2):  # every pool process, from before the eta until well after it
                tasks.slow.delay(BUSY_FOR)
            processes.wait_for(lambda: settled() and runs.count() == 3, 30, message="the call and the slow ones")
        monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
        text = client.get("/metrics/timeouts").content.decode()
    row = calls().get(biz_type="celery:tests.durable.record")
    body_started_at = next(started_at for task_id, *_, started_at in runs.all() if task_id == row.biz_id)
    late = (body_started_at - row.action_time).total_seconds()
    assert late > 0.5, late  # it did wait for a process
    assert abs((row.started_at - body_started_at).total_seconds()) < 0.1, (row.started_at, body_started_at)
    samples = {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples
               if s.labels.get("biz_type") == "celery:tests.durable.record" and "le" not in s.labels}
    assert samples["timeouts_lateness_seconds_count"] == 1
    assert abs(samples["timeouts_lateness_seconds_sum"] - late) < 0.1, (samples, late)


@contextmanager
def a_call_waiting_past_its_lease(runs, pool="prefork"):
    """A worker of one pool process (or thread), busy with a slow call; the dispatcher, and the scan
    recovering expired leases every 0.1 s. Yields the AsyncResult of a call whose lease is 1 s, started ahead
    by the worker's main process, once it has waited for the process past its eta and its lease;
    then waits until every message the worker took has run."""
    with processes.running_worker(env=processes.django_env(), name=f"one-{pool}", pool=pool, concurrency=1):
        with dispatcher_process("dispatcher", "--lead", LEAD), processes.scanning(0.1):
            tasks.slow.delay(HOLDS_THE_PROCESS)  # published at once: the process is busy from now on
            processes.wait_for(lambda: runs.count("tests.durable.slow") == 1, 30, message="the slow call")
            result = tasks.short_lease.apply_async(("waits",), countdown=1.5)
            processes.wait_for(lambda: started_before_due() == 1, 30, interval=0.01,
                               message="the call started before its eta")
            run_at = calls().get(biz_id=result.id).run_at
            # Past its eta, its 1 s lease and a few scans, while the slow call still holds the process.
            time.sleep(max(0.0, (run_at - datetime.now(UTC)).total_seconds() + 2.5))
            assert runs.count("tests.durable.short_lease") == 0, "the call ran before the process was free"
            yield result
            # Behind every message the worker holds for its one process: when it has run, they have.
            tasks.record.delay("last")
            processes.wait_for(lambda: runs.count("tests.durable.record") == 1 and settled(), 30,
                               message="every call to settle")
            time.sleep(1)  # a second run would show now


@pytest.mark.timeout(90)
@pytest.mark.parametrize("pool", [
    "prefork",  # the call waits in the worker's main process, for a process to free
    "threads",  # the call is handed to the pool at once, and waits there for its one thread
])
def test_a_call_started_ahead_is_kept_while_it_waits_for_a_process_past_its_lease_and_runs_once(
        transactional_db, broker, runs, pool):
    broker.flushdb()
    with a_call_waiting_past_its_lease(runs, pool) as result:
        row = calls().get(biz_id=result.id)
        assert (row.status, row.attempts) == (Status.RUNNING, 1), "its lease ran out while it waited"
    assert [r[0] for r in runs.all("tests.durable.short_lease")] == [result.id]
    row = calls().get(biz_id=result.id)
    assert (row.status, row.attempts, row.last_error) == (Status.DONE, 1, "")


@pytest.mark.timeout(90)
def test_a_cancel_while_a_started_call_waits_for_a_process_is_refused_or_wins(transactional_db, broker, runs):
    """The call is started: a cancel returns False, and the call runs once. A cancel that returned
    True (had its start been lost meanwhile) would mean that it never runs."""
    broker.flushdb()
    with a_call_waiting_past_its_lease(runs) as result:
        deadline = time.monotonic() + 1  # cancels for a second of its wait
        cancelled = timeouts.celery.cancel(result.id)
        while not cancelled and time.monotonic() < deadline:
            time.sleep(0.1)
            cancelled = timeouts.celery.cancel(result.id)
    ran = [r[0] for r in runs.all("tests.durable.short_lease")]
    assert ran == ([] if cancelled else [result.id]), (cancelled, ran)
