"""PENDING -> DISPATCHED -> RUNNING -> DONE, retries, DEAD, leases and the races between them,
driven in-process (the Celery message is just a call of running.run with its arguments)."""

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction

import timeouts
from tests.support.worker_steps import cancel_and_hold, claim_one, in_thread, sql
from timeouts import registry
from timeouts.dispatch.claiming import claim_due
from timeouts.models import TimeoutTask
from timeouts.protocol import Fence
from timeouts.store import clock
from timeouts.store.queries import fetch_one
from timeouts.store.recovery import recover_expired
from timeouts.worker import attempt, running

Status = TimeoutTask.Status
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


def due_task(biz_type="test.record", biz_id=1, **kwargs):
    return TimeoutTask.objects.schedule(biz_type, biz_id, delay=-0.001, **kwargs)


def run_message(claim):
    return running.run(claim.fence)


def reload(task):
    return TimeoutTask.objects.get(job_id=task.job_id, action_time=task.action_time)


def test_happy_path(starts):
    task = due_task()
    claim = claim_one()
    assert (claim.job_id, claim.attempt) == (task.job_id, 1)
    assert reload(task).status == Status.DISPATCHED
    assert run_message(claim) == "done"
    done = reload(task)
    assert (done.status, done.attempts, done.lease_until) == (Status.DONE, 1, None)
    assert done.action_time <= done.started_at <= done.finished_at
    assert [row[:2] for row in starts.all()] == [(task.job_id, 1)]


def test_future_tasks_are_not_claimed():
    TimeoutTask.objects.schedule("test.record", 1, delay=60)
    assert claim_due(10) == []
    assert len(claim_due(10, lead=120)) == 1


def test_claims_come_in_due_order_and_in_batches():
    now = datetime.now(UTC)
    TimeoutTask.objects.bulk_schedule(
        [{"biz_type": "test.record", "biz_id": i, "at": now - timedelta(seconds=i)} for i in range(25)]
    )
    first = claim_due(10)
    assert [c.job_id for c in first] == sorted((c.job_id for c in first), reverse=True)
    assert len(first) == 10 and len(claim_due(10)) == 10 and len(claim_due(10)) == 5 and claim_due(10) == []


def test_stale_and_duplicate_messages_are_dropped(starts):
    task = due_task()
    claim = claim_one()
    assert running.run(Fence(task.job_id, claim.action_time, 2)) == "dropped"  # wrong attempt
    assert run_message(claim) == "done"
    assert run_message(claim) == "dropped"  # redelivered after it ran
    assert starts.count() == 1


def test_cancel_after_claim_fences_the_message(starts):
    task = due_task()
    claim = claim_one()
    assert task.cancel() is True
    assert run_message(claim) == "dropped"
    assert starts.count() == 0 and reload(task).status == Status.CANCELLED


def test_failing_handler_retries_with_backoff_then_dies(starts):
    task = due_task("test.fail")
    assert run_message(claim_one()) == "retry"
    retried = reload(task)
    assert retried.status == Status.PENDING and retried.attempts == 1
    assert "failing on purpose (attempt 1)" in retried.last_error and "Traceback" in retried.last_error
    backoff = retried.run_at - retried.started_at
    assert timedelta(seconds=1) <= backoff <= timedelta(seconds=2.1)
    assert claim_due(10) == []  # waits out its backoff
    sql("UPDATE timeouts_task SET run_at = action_time WHERE job_id = %s", [task.job_id])
    assert run_message(claim_one()) == "dead"
    dead = reload(task)
    assert (dead.status, dead.attempts) == (Status.DEAD, 2) and dead.finished_at is not None
    assert list(TimeoutTask.objects.dead()) == [dead]
    assert dead.requeue() is True and dead.attempts == 0
    assert len(claim_due(10)) == 1
    assert starts.count() == 2


def run_a_handler_raising(exc):
    """The row after a one-attempt handler raised `exc`, and the outcome."""
    def fails(task):
        raise exc

    timeouts.handler("test.fail_once", max_attempts=1)(fails)
    try:
        task = due_task("test.fail_once")
        outcome = run_message(claim_one())
        return reload(task), outcome
    finally:
        registry.unregister("test.fail_once")


def test_a_handler_error_with_nul_is_stored_with_the_nul_escaped():
    dead, outcome = run_a_handler_raising(ValueError("before\x00after"))  # PostgreSQL's text holds no NUL
    assert (outcome, dead.status) == ("dead", Status.DEAD)
    assert "ValueError: before\\x00after" in dead.last_error


def test_a_handler_that_calls_sys_exit_fails_as_any_raising_handler():
    dead, outcome = run_a_handler_raising(SystemExit(3))
    assert (outcome, dead.status) == ("dead", Status.DEAD)
    assert "SystemExit: 3" in dead.last_error


def test_unknown_handler_in_the_worker_counts_as_a_failure():
    task = due_task()
    sql("UPDATE timeouts_task SET biz_type = 'gone.handler' WHERE job_id = %s", [task.job_id])
    assert run_message(claim_one()) == "retry"
    assert "gone.handler" in reload(task).last_error


def test_lease_recovery():
    never_started = due_task(biz_id="claimed")
    started = due_task(biz_id="started")
    last_attempt = due_task("test.fail", biz_id="last")  # max_attempts=2
    claims = {c.job_id: c for c in claim_due(10)}
    assert attempt.start({"job_id": started.job_id, "action_time": started.action_time}, 1) is not None
    sql("UPDATE timeouts_task SET attempts = 1 WHERE job_id = %s", [last_attempt.job_id])
    assert attempt.start({"job_id": last_attempt.job_id, "action_time": last_attempt.action_time}, 2) is not None
    assert recover_expired() == 0  # leases still valid
    sql("UPDATE timeouts_task SET lease_until = clock_timestamp() - interval '1 second'")
    assert recover_expired() == 3
    assert (reload(never_started).status, reload(never_started).attempts) == (Status.PENDING, 0)
    recovered = reload(started)
    assert (recovered.status, recovered.attempts) == (Status.PENDING, 1) and "lease" in recovered.last_error
    assert reload(last_attempt).status == Status.DEAD
    # The old messages are stale now; the re-dispatch runs.
    assert run_message(claims[started.job_id]) == "dropped"
    redispatched = {c.job_id: c for c in claim_due(10)}
    assert redispatched[started.job_id].attempt == 2
    assert run_message(redispatched[started.job_id]) == "done"


def test_early_message_waits_for_run_at_by_the_database_clock(starts):
    task = TimeoutTask.objects.schedule("test.record", 1, delay=0.3)
    claim = claim_due(10, lead=1.0)[0]
    assert run_message(claim) == "done"
    done = reload(task)
    assert done.started_at >= done.action_time


def test_a_start_recorded_ahead_returns_at_run_at_by_the_database_clock():
    task = TimeoutTask.objects.schedule("test.record", 1, delay=0.3)
    claim = claim_due(10, lead=1.0)[0]
    key = {"job_id": claim.job_id, "action_time": claim.action_time}
    started = attempt.start(key, claim.attempt, ahead=2.0)  # recorded at once: run_at is under 0.3 s away
    assert started is not None and clock.database_now() >= started.run_at  # never before run_at
    row = reload(task)
    assert (row.status, row.started_at) == (Status.RUNNING, row.run_at)  # recorded as starting at run_at
    assert row.modified_at < row.run_at  # ... before run_at
    assert row.lease_until == row.run_at + timedelta(seconds=row.ttr)


def test_a_start_is_not_recorded_further_ahead_than_allowed():
    task = TimeoutTask.objects.schedule("test.record", 1, delay=0.3)
    claim = claim_due(10, lead=1.0)[0]
    started = attempt.start({"job_id": claim.job_id, "action_time": claim.action_time}, claim.attempt, ahead=0.05)
    row = reload(task)
    # waited until run_at was within 50 ms, then recorded as starting at run_at
    assert started is not None and row.started_at == row.run_at
    assert row.run_at - timedelta(seconds=0.05) <= row.modified_at
    assert clock.database_now() >= row.run_at


def test_rescheduled_message_is_dropped_not_waited_for(starts):
    task = due_task()
    claim = claim_one()
    assert task.reschedule(delay=3600) is True  # DISPATCHED, not started: may still move
    assert run_message(claim) == "dropped"
    assert starts.count() == 0 and reload(task).status == Status.PENDING


def test_cancel_waits_for_a_concurrent_start_and_then_loses(starts):
    task = due_task()
    claim = claim_one()
    started, release = threading.Event(), threading.Event()

    def start_and_hold():
        with transaction.atomic():
            row = fetch_one("start_task", {"job_id": claim.job_id, "action_time": claim.action_time, "attempt": 1,
                                           "lease_extra": 0, "ahead": 0})
            started.set()
            release.wait(10)
        return row

    starter, start_result = in_thread(start_and_hold)
    assert started.wait(10)
    canceller, cancel_result = in_thread(lambda: TimeoutTask.objects.get(job_id=task.job_id).cancel())
    canceller.join(0.3)
    assert canceller.is_alive(), "cancel must wait for the row lock of the start"
    release.set()
    starter.join(10), canceller.join(10)
    assert start_result["value"] is not None and cancel_result["value"] is False


def test_start_waits_for_a_concurrent_cancel_and_then_drops(starts):
    task = due_task()
    claim = claim_one()
    canceller, cancel_result, locked, release = cancel_and_hold(task.job_id)
    assert locked.wait(10)
    runner, run_result = in_thread(lambda: run_message(claim))
    runner.join(0.3)
    assert runner.is_alive(), "the compare-and-set must wait for the cancel's row lock"
    release.set()
    canceller.join(10), runner.join(10)
    assert cancel_result["value"] is True and run_result["value"] == "dropped"
    assert starts.count() == 0


def test_cancel_follows_a_row_moved_by_a_concurrent_reschedule():
    """SQLSTATE 40001 (tuple moved to another partition) is retried and the cancel still wins."""
    task = TimeoutTask.objects.schedule("test.record", 1, delay=60)
    scheduled_for = task.action_time
    moved, release = threading.Event(), threading.Event()

    def reschedule_and_hold():
        with transaction.atomic():
            result = TimeoutTask.objects.get(job_id=task.job_id).reschedule(delay=timedelta(days=5))
            moved.set()
            release.wait(10)
        return result

    mover, move_result = in_thread(reschedule_and_hold)
    assert moved.wait(10)
    canceller, cancel_result = in_thread(task.cancel)
    canceller.join(0.3)
    assert canceller.is_alive()
    release.set()
    mover.join(10), canceller.join(10)
    assert move_result["value"] is True
    assert cancel_result.get("error") is None and cancel_result["value"] is True
    stored = TimeoutTask.objects.get(job_id=task.job_id)
    assert stored.status == Status.CANCELLED and stored.action_time > scheduled_for + timedelta(days=4)


def test_two_claimers_never_share_a_task(settings):
    settings.TIMEOUTS = {"MAX_DISPATCHED": 100_000}  # no workers here: claims are never started
    TimeoutTask.objects.bulk_schedule([{"biz_type": "test.record", "biz_id": i, "delay": -1} for i in range(2000)])
    claimed = [[], []]
    barrier = threading.Barrier(2)

    def claimer(index):
        barrier.wait()
        while batch := claim_due(50):
            claimed[index].extend(c.job_id for c in batch)

    threads = [in_thread(lambda i=i: claimer(i))[0] for i in range(2)]
    for thread in threads:
        thread.join(30)
    everything = claimed[0] + claimed[1]
    assert len(everything) == len(set(everything)) == 2000


def test_claims_stop_at_max_dispatched_until_tasks_start(settings, starts):
    settings.TIMEOUTS = {"MAX_DISPATCHED": 30}
    TimeoutTask.objects.bulk_schedule([{"biz_type": "test.record", "biz_id": i, "delay": -1} for i in range(100)])
    first = claim_due(20) + claim_due(20) + claim_due(20)
    assert len(first) == 30 and claim_due(20) == []
    for claim in first[:5]:
        assert run_message(claim) == "done"
    assert len(claim_due(20)) == 5


def test_claims_pause_while_a_batch_of_claims_waits_more_than_half_its_ttr(starts):
    TimeoutTask.objects.bulk_schedule([{"biz_type": "test.record", "biz_id": i, "delay": -1} for i in range(20)])
    waiting = claim_due(5)
    assert len(claim_due(5)) == 5  # recently claimed: the workers keep up

    def age(claims, fraction_of_ttr_left):
        sql("UPDATE timeouts_task SET lease_until = now() + ttr * %s * interval '1 second' WHERE job_id = ANY(%s)",
            [fraction_of_ttr_left, [c.job_id for c in claims]])

    # Five claims have waited 0.6 of their TTR for a worker: a batch's worth, the workers are saturated.
    age(waiting, 0.4)
    assert claim_due(5) == []
    assert run_message(waiting[0]) == "done"
    assert len(claim_due(5)) == 5  # four old ones are fewer than a batch

    # A lost message (its lease ran out) is for lease recovery; it never pauses claiming.
    age(waiting[1:], -0.1)
    assert len(claim_due(5)) == 5


def test_the_saturation_pause_also_works_when_max_dispatched_is_below_a_batch(settings, starts):
    # Found by the database-fault scenarios: the guard counted at most MAX_DISPATCHED claims and
    # compared them with the batch size, so with MAX_DISPATCHED < SCAN_BATCH_SIZE it never paused.
    settings.TIMEOUTS = {"MAX_DISPATCHED": 10}
    TimeoutTask.objects.bulk_schedule([{"biz_type": "test.record", "biz_id": i, "delay": -1} for i in range(40)])
    waiting = claim_due(500)
    assert len(waiting) == 10
    assert run_message(waiting[0]) == "done"  # room for one more claim
    sql("UPDATE timeouts_task SET lease_until = now() + ttr * 0.4 * interval '1 second' WHERE job_id = ANY(%s)",
        [[c.job_id for c in waiting[1:]]])
    # Nine claims have waited 0.6 of their TTR: at least half of MAX_DISPATCHED, so the workers are
    # saturated, whatever the batch size.
    assert claim_due(500) == []


def test_a_start_reconnects_when_the_connection_died_while_the_worker_was_idle(starts):
    """Workers check their connection after a message, not before the next (tasks.py): a backend
    killed in between fails the next compare-and-set, which runs again on a new connection."""
    from timeouts import tasks

    first, second = due_task(biz_id=1), due_task(biz_id=2)
    claims = {claim.job_id: claim for claim in claim_due(10)}
    assert tasks.run(*claims[first.job_id].message_args()) == "done"
    assert connection.health_check_done  # checked after the message: the next one will not ping
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        [pid] = cursor.fetchone()
    thread, result = in_thread(lambda: sql("SELECT pg_terminate_backend(%s)", [pid]))
    thread.join(10)
    assert "error" not in result
    assert tasks.run(*claims[second.job_id].message_args()) == "done"
    assert reload(second).status == Status.DONE
    assert sorted(row[0] for row in starts.all()) == sorted([first.job_id, second.job_id])


def test_a_message_run_inside_the_callers_transaction_leaves_its_connection_alone(starts):
    """Celery's eager mode (a host's tests) runs the message where it was published: the connection
    checks after the message must not close the connection under the caller's transaction."""
    from timeouts import tasks

    task = due_task()
    claim = claim_one()
    with transaction.atomic():
        assert tasks.run(*claim.message_args()) == "done"
        assert reload(task).status == Status.DONE  # the same transaction goes on
    assert reload(task).status == Status.DONE
