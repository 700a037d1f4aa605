"""DurableTask end to end: real Celery worker processes, the real broker (Redis) and the safety
scan run in the test process as beat would run it."""

import os
import signal
import time
from datetime import UTC, datetime, timedelta

import psutil
import pytest
import redis
from celery.result import AsyncResult
from django.db import transaction

import timeouts.celery
from tests.support import processes
from tests.testapp import tasks
from timeouts.dispatch.scan import scan
from timeouts.durable.calls import PREFIX
from timeouts.models import TimeoutTask

Status = TimeoutTask.Status
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def scan_until(predicate, timeout, message):
    def step():
        scan()
        return predicate()

    return processes.wait_for(step, timeout=timeout, interval=0.1, message=message)


def calls(**filters):
    return TimeoutTask.objects.filter(biz_type__startswith=PREFIX, **filters)


def settled():
    return not calls(status__in=[Status.PENDING, Status.DISPATCHED, Status.RUNNING]).exists()


@pytest.mark.timeout(90)
def test_calls_run_at_their_time_once_with_their_task_id_and_arguments_never_early(worker, runs):
    results = [tasks.record.apply_async((i, "x"), {"n": i}, countdown=1 + i / 10) for i in range(10)]
    assert runs.count() == 0 and calls(status=Status.PENDING).count() == 10
    scan_until(settled, 60, "every call to run")
    time.sleep(0.5)  # a duplicate would show now
    rows = runs.all()
    assert sorted((r[0], tuple(r[2]), r[3]["n"]) for r in rows) == sorted(
        (res.id, (i, "x"), i) for i, res in enumerate(results))
    due = {row.biz_id: row for row in calls()}
    assert all(due[task_id].status == Status.DONE for task_id, *_ in rows)
    assert all(started_at >= due[task_id].action_time for task_id, *_, started_at in rows)


@pytest.mark.timeout(60)
def test_a_rolled_back_call_never_runs_and_a_cancelled_one_never_runs(worker, runs):
    with pytest.raises(RuntimeError), transaction.atomic():
        tasks.record.apply_async(("rolled back",), countdown=0.5)
        raise RuntimeError
    cancelled = tasks.record.apply_async(("cancelled",), countdown=0.5)
    kept = tasks.record.apply_async(("kept",), countdown=0.5)
    assert timeouts.celery.cancel(cancelled.id) is True
    scan_until(lambda: runs.count() >= 1 and settled(), 30, "the kept call")
    time.sleep(1)
    scan()
    assert [(r[0], r[2]) for r in runs.all()] == [(kept.id, ["kept"])]


@pytest.mark.timeout(120)
def test_a_true_cancel_racing_the_due_time_never_runs(worker, runs):
    with processes.scanning(0.005):
        # Every other call, just before, at, or after its due time, while it is claimed, published, started.
        cancel_racing_due_times(runs, lead=2, offsets=[-0.03, -0.01, 0.0, 0.005, 0.01, 0.03, 0.1])


def cancel_racing_due_times(runs, lead, offsets):
    """Make 200 calls due 20 ms apart from `lead` seconds on, cancel every other one at its due time
    plus the next of `offsets` (seconds), and check that no call a cancel won ever ran, and that
    every other call ran once."""
    first = datetime.now(UTC) + timedelta(seconds=lead)
    etas = [first + timedelta(milliseconds=20 * i) for i in range(200)]
    results = [tasks.record.apply_async((i,), eta=eta) for i, eta in enumerate(etas)]
    cancelled = set()
    for n, i in enumerate(range(0, len(results), 2)):
        wait = (etas[i] - datetime.now(UTC)).total_seconds() + offsets[n % len(offsets)]
        time.sleep(max(wait, 0))
        if timeouts.celery.cancel(results[i].id):
            cancelled.add(results[i].id)
    processes.wait_for(settled, 60, message="every call settled")
    time.sleep(0.5)
    ran = [r[0] for r in runs.all()]
    assert cancelled and len(cancelled) < 100, "some cancels must have won, some lost"
    assert len(ran) == len(set(ran)), "a call ran twice"
    assert not set(ran) & cancelled
    assert set(ran) | cancelled == {r.id for r in results}


@pytest.mark.timeout(60)
def test_routing_to_a_named_queue_and_a_link_callback(worker, runs):
    routed = tasks.record.apply_async(("routed",), countdown=0.5, queue="timeouts-test-other")
    linked = tasks.record.apply_async(("linked",), countdown=0.5, link=tasks.record.si("callback"))
    scan_until(lambda: runs.count() == 3, 30, "both calls and the callback")
    by_args = {tuple(r[2]): r for r in runs.all()}
    assert by_args[("routed",)][0] == routed.id and by_args[("routed",)][4] == "timeouts-test-other"
    assert by_args[("linked",)][0] == linked.id and ("callback",) in by_args


@pytest.mark.timeout(60)
def test_an_expired_call_does_not_run_and_says_so(worker, runs):
    tasks.record.apply_async(("expired",), countdown=0.5, expires=0.2)
    kept = tasks.record.apply_async(("kept",), countdown=0.5, expires=60)
    scan_until(lambda: runs.count() == 1 and settled(), 30, "the unexpired call")
    assert [r[0] for r in runs.all()] == [kept.id]
    [expired] = calls(status=Status.CANCELLED)
    assert "expired" in expired.last_error


@pytest.mark.timeout(60)
def test_a_retry_with_a_countdown_goes_durable_again(worker, runs):
    result = tasks.retry_once.apply_async((1.5,), countdown=0.3)
    scan_until(lambda: runs.count() == 1 and calls().count() == 2, 30, "the first run and its stored retry")
    first, retry = calls().order_by("job_id")
    assert first.biz_id == retry.biz_id == result.id
    assert first.status == Status.DONE and first.last_error.startswith("retried")
    assert retry.status in (Status.PENDING, Status.DISPATCHED)
    assert retry.attribute["message"]["retries"] == 1 and not retry.attribute["headers"]
    scan_until(lambda: runs.count() == 2 and settled(), 30, "the retry")
    assert [(r[0], r[5]) for r in runs.all()] == [(result.id, 0), (result.id, 1)]
    assert calls().get(job_id=retry.job_id).started_at >= retry.action_time


@pytest.mark.timeout(60)
def test_a_raising_call_ends_dead_with_its_traceback_and_runs_again_when_requeued(worker, runs):
    result = tasks.fail.apply_async(countdown=0.3)
    scan_until(settled, 30, "the failing call")
    [row] = calls()
    assert row.status == Status.DEAD and "failing on purpose\\x00" in row.last_error
    assert runs.count() == 1
    assert row.requeue()
    scan_until(lambda: runs.count() == 2 and settled(), 30, "the requeued call")
    assert [r[0] for r in runs.all()] == [result.id, result.id]


@pytest.mark.timeout(60)
def test_a_call_killed_at_its_hard_time_limit_ends_dead_and_does_not_run_again(worker, runs):
    tasks.overrun.apply_async(countdown=0.3)
    scan_until(settled, 30, "the call to be killed")
    [row] = calls()
    assert row.status == Status.DEAD and "TimeLimitExceeded" in row.last_error
    time.sleep(3)  # past its lease (time limit + 1 s)
    scan()
    assert runs.count() == 1


@pytest.mark.timeout(90)
def test_a_kept_result_is_returned_by_async_result_get(transactional_db, broker, runs):
    from celery.backends.redis import RedisBackend

    from project.celery import app

    broker.flushdb()
    backend = RedisBackend(app=app, url=app.conf.broker_url)
    env = processes.django_env(DJANGO_SETTINGS_MODULE="tests.settings_results")
    with processes.running_worker(env=env, name="worker-results"):
        result = tasks.add.apply_async((2, 3), countdown=0.5)
        scan_until(settled, 30, "the call")
        assert AsyncResult(result.id, backend=backend, app=app).get(timeout=10) == 5


@pytest.mark.timeout(120)
def test_a_worker_killed_with_calls_pending_loses_none(worker, runs):
    kill_with_calls_pending(worker, runs, processes.django_env())


@pytest.mark.timeout(120)
def test_a_worker_without_ack_emulation_killed_with_calls_pending_loses_none(broker, runs):
    """kombu's Redis transport then keeps no copy of the messages a worker holds: the database's
    leases bring them back, as they do with it (its copies come back after visibility_timeout)."""
    broker.flushdb()
    env = processes.django_env(DJANGO_SETTINGS_MODULE="tests.settings_without_ack_emulation")

    def holds_no_copies():
        if isinstance(broker, redis.Redis):  # kombu's hash of the messages workers hold
            assert not broker.hlen("unacked")

    with processes.running_worker(env=env) as worker:
        kill_with_calls_pending(worker, runs, env, before_kill=holds_no_copies)


def kill_with_calls_pending(worker, runs, env, before_kill=lambda: None):
    count = 200
    results = [tasks.record.apply_async((i,), countdown=1 + i / 100) for i in range(count)]
    slow = tasks.slow.apply_async((30,), countdown=0.2)
    scan_until(lambda: runs.count() >= 50, 30, "some calls to run")
    before_kill()
    for process in psutil.Process(worker.pid).children(recursive=True) + [psutil.Process(worker.pid)]:
        os.kill(process.pid, signal.SIGKILL)
    worker.wait(10)
    replacement = processes.celery_worker(env=env, name="replacement")
    try:
        # The calls the killed worker had started or prefetched run again once their lease (the
        # tasks' ttr: 3 and 5 s) runs out.
        scan_until(lambda: settled() and {r[0] for r in runs.all("tests.durable.record")} >= {r.id for r in results},
                   90, "every call to run")
    finally:
        processes.stop(replacement)
    assert [r[0] for r in runs.all("tests.durable.slow")] == [slow.id, slow.id]
    assert calls(status=Status.DONE).count() == count + 1


@pytest.mark.timeout(60)
def test_a_call_published_twice_runs_once(worker, runs):
    """A publisher that crashed after sending, before its claim was known to be sent, sends again."""
    from timeouts.dispatch.claiming import claim_due
    from timeouts.dispatch.publishing import publish

    result = tasks.record.apply_async(("twice",), countdown=0.3)
    time.sleep(0.4)
    claims = claim_due(10)
    assert [claim.biz_type for claim in claims] == ["celery:tests.durable.record"]
    publish(claims)
    publish(claims)
    processes.wait_for(settled, 30, message="the call")
    time.sleep(1)  # the second message, dropped by the compare-and-set
    assert [r[0] for r in runs.all()] == [result.id]
    assert calls().get().attempts == 1


@pytest.mark.timeout(90)
def test_the_dispatcher_starts_calls_on_time_without_a_scan(worker, runs):
    """The dispatcher publishes by task name: it has not imported the tasks."""
    from tests.system.test_dispatcher import ON_TIME, dispatcher_process

    with dispatcher_process():
        results = [tasks.record.apply_async((i,), countdown=1 + i / 10) for i in range(20)]
        processes.wait_for(lambda: runs.count() == 20 and settled(), 60, message="every call, no scan")
    assert sorted(r[0] for r in runs.all()) == sorted(r.id for r in results)
    lateness = [(row.started_at - row.action_time).total_seconds() for row in calls()]
    assert all(0 <= late < ON_TIME for late in lateness), lateness


@pytest.mark.timeout(60)
def test_a_chain_with_a_countdown_runs_every_step(worker, runs):
    from celery import chain

    chain(tasks.record.s("first"), tasks.record.s("second")).apply_async(countdown=0.5)
    scan_until(lambda: runs.count() == 2, 30, "both steps")
    assert [r[2] for r in runs.all()] == [["first"], [["first"], "second"]]  # a step gets its parent's result


@pytest.mark.timeout(60)
def test_a_call_running_longer_than_its_lease_runs_once(worker, runs):
    """Its worker extends the lease while it runs: lease recovery does not take it for lost."""
    result = tasks.longer_than_its_lease.apply_async((4,), countdown=0.3)
    scan_until(lambda: runs.count() == 1, 30, "the call to start")
    scan_until(settled, 30, "the call to end")  # each scan recovers expired leases first
    assert [r[0] for r in runs.all()] == [result.id]
    row = calls().get()
    assert (row.status, row.attempts, row.last_error) == (Status.DONE, 1, "")


@pytest.mark.timeout(60)
def test_a_rejected_call_ends_dead_with_the_reason(worker, runs):
    tasks.reject.apply_async(countdown=0.3)
    scan_until(settled, 30, "the rejected call")
    [row] = calls()
    assert row.status == Status.DEAD and "rejecting on purpose" in row.last_error
    assert runs.count() == 1


@pytest.mark.timeout(90)
def test_a_call_that_expires_on_its_way_to_the_worker_ends_cancelled(transactional_db, broker, runs):
    """Published in time, it reaches a worker after its `expires` (no worker was up): Celery discards
    it; its claim's lease runs out, and the next claim finds it expired instead of publishing it again."""
    broker.flushdb()
    tasks.record.apply_async(("late",), countdown=0.2, expires=1)
    time.sleep(0.3)
    scan()
    assert calls(status=Status.DISPATCHED).count() == 1
    time.sleep(1)
    with processes.running_worker(env=processes.django_env(), name="worker-late"):
        scan_until(settled, 30, "the call's lease (5 s) to run out and the call to be found expired")
    [row] = calls()
    assert row.status == Status.CANCELLED and "expired" in row.last_error
    assert runs.count() == 0
