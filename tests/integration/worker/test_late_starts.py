"""The lateness policy at the worker's compare-and-set: a start later than max_lateness is run,
skipped (CANCELLED) or made DEAD, by the database clock, in the statement that starts; a retry is
measured against its own due time; set_limits() beats the handler's own; a cancel that returned True
is never undone; a requeue runs the task once; and a real worker process does the same."""

import re
import threading
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

import timeouts
from tests.support import processes
from tests.support.isolation import no_limits  # noqa: F401  (a fixture)
from tests.support.worker_steps import cancel_and_hold, claim_one, in_thread, sql
from tests.testapp import tasks as durable_tasks
from tests.testapp.recorder import record
from timeouts import events, registry
from timeouts.dispatch.claiming import claim_due
from timeouts.limiting import controls, lateness
from timeouts.migrations import read_sql_file
from timeouts.models import TimeoutTask
from timeouts.store import attempts, queries
from timeouts.worker import attempt, batches, running

Status = TimeoutTask.Status
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60), pytest.mark.usefixtures("no_limits")]

SKIPPED_TEXT = re.compile(r"not run: started (\d+\.\d) s after its time, over max_lateness 5 s \(on_late=skip\)")


def scheduled(biz_type="test.record", biz_id=1, ago=30.0):
    """A task due `ago` seconds ago."""
    return TimeoutTask.objects.schedule(biz_type, biz_id, at=datetime.now(UTC) - timedelta(seconds=ago))


def reload(task):
    return TimeoutTask.objects.get(job_id=task.job_id)  # a requeue moves action_time


@pytest.fixture
def heard():
    """The "late", "cancelled" and "dead" events, as (event, biz_type, lateness, on_late)."""
    found = []

    def listener(event, biz_type, count, lateness, on_late=None):
        if event in ("late", "cancelled", "dead"):
            found.append((event, biz_type, lateness, on_late))

    events.listen(listener)
    yield found
    events.listeners.remove(listener)


@pytest.fixture
def late_handler():
    """A handler that declares skip after 5 s, declared as the scan would; forgotten afterwards."""
    timeouts.handler("test.late", max_lateness=timedelta(seconds=5), on_late="skip")(record)
    controls.declare()
    yield "test.late"
    registry.unregister("test.late")


def test_a_start_later_than_max_lateness_is_skipped(late_handler, starts, heard):
    task = scheduled(late_handler, ago=30)
    assert running.run(claim_one().fence) == "skipped late"
    skipped = reload(task)
    assert (skipped.status, skipped.attempts, skipped.started_at) == (Status.CANCELLED, 0, None)
    assert skipped.finished_at is not None and skipped.lease_until is None
    late_by = float(SKIPPED_TEXT.fullmatch(skipped.last_error).group(1))
    assert 30 <= late_by < 60
    assert starts.count() == 0
    assert [(event, on_late) for event, *_, on_late in heard] == [("late", "skip"), ("cancelled", None)]
    assert heard[0][2] >= 30


def test_a_start_within_max_lateness_runs(late_handler, starts, heard):
    task = scheduled(late_handler, ago=1)
    assert running.run(claim_one().fence) == "done"
    assert reload(task).status == Status.DONE and starts.count() == 1 and heard == []


def test_dead_ends_the_task_dead_and_a_requeue_runs_it_once(starts, heard):
    timeouts.set_limits("test.record", max_lateness=timedelta(seconds=2), on_late="dead")
    task = scheduled(ago=10)
    assert running.run(claim_one().fence) == "dead late"
    dead = reload(task)
    assert dead.status == Status.DEAD and dead.attempts == 0
    assert dead.last_error.endswith("over max_lateness 2 s (on_late=dead)")
    assert list(TimeoutTask.objects.dead()) == [dead] and starts.count() == 0
    assert [event for event, *_ in heard] == ["late", "dead"]

    assert dead.requeue() is True  # due now: not late by its old action_time
    sql("UPDATE timeouts_task SET run_at = run_at - interval '1 minute', action_time = action_time - interval "
        "'1 minute' WHERE job_id = %s", [task.job_id])  # as if the requeued task waited a minute, later still
    claim = claim_one()
    assert running.run(claim.fence) == "done"  # the operator asked for it: it runs, however late
    assert running.run(claim.fence) == "dropped"  # once
    assert reload(task).status == Status.DONE and [row[:2] for row in starts.all()] == [(task.job_id, 1)]
    assert [event for event, *_ in heard] == ["late", "dead"]  # its run is not counted as late


def test_a_requeued_task_that_starts_on_time_runs_under_any_policy(starts):
    timeouts.set_limits("test.record", max_lateness=timedelta(seconds=2), on_late="skip")
    task = scheduled(ago=10)
    assert running.run(claim_one().fence) == "skipped late"
    task = reload(task)
    assert task.requeue() is True
    assert running.run(claim_one().fence) == "done" and starts.count() == 1


def test_run_runs_a_late_start_and_counts_it(starts, heard):
    timeouts.set_limits("test.record", max_lateness=timedelta(seconds=2))  # on_late "run"
    assert timeouts.limits("test.record").on_late == "run"
    task = scheduled(ago=10)
    assert running.run(claim_one().fence) == "done"
    assert reload(task).status == Status.DONE and starts.count() == 1
    [(event, biz_type, late_by, on_late)] = heard
    assert (event, biz_type, on_late) == ("late", "test.record", "run") and late_by >= 10


def test_without_a_policy_a_late_start_runs_uncounted(starts, heard):
    task = scheduled(ago=3600)
    assert running.run(claim_one().fence) == "done"
    assert reload(task).status == Status.DONE and heard == []


def test_set_limits_beats_the_handlers_own_policy_until_reset(late_handler, starts):
    timeouts.set_limits(late_handler, max_lateness=timedelta(minutes=5), on_late="skip")
    first = scheduled(late_handler, 1, ago=30)
    assert running.run(claim_one().fence) == "done"  # within the override's 5 minutes
    timeouts.set_limits(late_handler, max_lateness=timedelta(seconds=1), on_late="dead")
    second = scheduled(late_handler, 2, ago=3)
    assert running.run(claim_one().fence) == "dead late"
    timeouts.reset_limits(late_handler)  # the handler's own: skip after 5 s
    third = scheduled(late_handler, 3, ago=3)
    fourth = scheduled(late_handler, 4, ago=30)
    assert sorted(running.run(claim.fence) for claim in claim_due(10)) == ["done", "skipped late"]
    assert [reload(task).status for task in (first, second, third, fourth)] == [
        Status.DONE, Status.DEAD, Status.DONE, Status.CANCELLED]


def test_a_retry_is_measured_against_its_own_due_time(starts):
    """Attempt 1 runs with no policy; a policy of 30 s then applies to attempt 2, due an hour after
    the task's action_time: it runs when it starts on time for itself, and is skipped once it starts
    40 s after the end of its backoff."""
    on_time, late = scheduled("test.fail", 1, ago=60), scheduled("test.fail", 2, ago=60)
    assert sorted(running.run(claim.fence) for claim in claim_due(10)) == ["retry", "retry"]
    timeouts.set_limits("test.fail", max_lateness=timedelta(seconds=30), on_late="skip")
    sql("UPDATE timeouts_task SET run_at = now() WHERE job_id = %s", [on_time.job_id])
    sql("UPDATE timeouts_task SET run_at = now() - interval '40 seconds' WHERE job_id = %s", [late.job_id])
    assert sorted(running.run(claim.fence) for claim in claim_due(10)) == ["dead", "skipped late"]
    ran, skipped = reload(on_time), reload(late)
    assert (ran.status, ran.attempts) == (Status.DEAD, 2) and "failing on purpose (attempt 2)" in ran.last_error
    assert (skipped.status, skipped.attempts) == (Status.CANCELLED, 1)
    assert re.fullmatch(r"not run: started 4\d\.\d s after its time, over max_lateness 30 s \(on_late=skip\)",
                        skipped.last_error)
    assert skipped.started_at is not None  # its first attempt's


def test_a_batch_applies_the_policy_to_the_start_it_writes_with_a_done(starts):
    timeouts.set_limits("test.record", max_lateness=timedelta(seconds=20), on_late="skip")
    late, on_time = scheduled(biz_id=1, ago=60), scheduled(biz_id=2, ago=1)
    claims = {claim.job_id: claim for claim in claim_due(10)}
    batch = [claims[on_time.job_id].batch_item(), claims[late.job_id].batch_item()]
    with CaptureQueriesContext(connection) as captured:
        assert batches.run_batch(batch) == "1 done, 1 skipped late"
    names = [name for q in captured for name in ("finish_then_start_task", "start_task")
             if q["sql"].lstrip().startswith(queries.QUERIES[name].split("\n", 1)[0])]
    assert names[:2] == ["start_task", "finish_then_start_task"]
    assert (reload(on_time).status, reload(late).status) == (Status.DONE, Status.CANCELLED)
    assert [row[0] for row in starts.all()] == [on_time.job_id]


def test_a_start_ahead_that_is_late_is_refused_and_ends_the_task(heard):
    """The start a worker's main process records for a DurableTask call (durable/starts.py)."""
    timeouts.set_limits("test.record", max_lateness=timedelta(seconds=1), on_late="skip")
    task = scheduled(ago=10)
    claim = claim_one()
    assert attempt.start_ahead(claim.fence.key, claim.attempt, None, 0.5) is None
    assert reload(task).status == Status.CANCELLED
    assert [event for event, *_ in heard] == ["late", "cancelled"]


def test_the_text_the_start_writes_is_the_one_lateness_reads():
    for name in ("start_task", "finish_then_start_task"):  # written, and read for a requeue
        assert queries.QUERIES[name].count(f"'{lateness.NOT_RUN}") == 2
    assert f"last_error LIKE '{lateness.NOT_RUN}%'" in read_sql_file("0001_tasks.sql")  # the admin's index


# --- Races with a cancel, on separate connections ------------------------------------------------------

def waiting_for_a_row_lock(thread_count=1):
    """Until that many other sessions of this database wait for a lock (read on this connection)."""
    def waiting():
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                           "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()")
            return cursor.fetchone()[0] >= thread_count
    processes.wait_for(waiting, 10, message="a session waiting for the row lock")


@pytest.mark.parametrize("on_late", ["skip", "dead"])
def test_a_cancel_that_returned_true_is_not_undone_by_a_late_start(on_late, starts):
    timeouts.set_limits("test.record", max_lateness=timedelta(seconds=1), on_late=on_late)
    task = scheduled(ago=10)
    claim = claim_one()
    canceller, cancel_result, locked, release = cancel_and_hold(task.job_id)
    assert locked.wait(10)
    runner, run_result = in_thread(lambda: running.run(claim.fence))
    waiting_for_a_row_lock()
    release.set()
    canceller.join(10), runner.join(10)
    assert cancel_result["value"] is True and run_result["value"] == "dropped"
    after = reload(task)
    assert (after.status, after.last_error, after.attempts) == (Status.CANCELLED, "", 0)
    assert starts.count() == 0


def test_a_cancel_after_a_late_start_made_the_task_dead_discards_it(starts):
    timeouts.set_limits("test.record", max_lateness=timedelta(seconds=1), on_late="dead")
    task = scheduled(ago=10)
    claim = claim_one()
    started, release = threading.Event(), threading.Event()

    def start_and_hold():
        with transaction.atomic():
            row = attempts.start(claim.fence.key, claim.attempt)
            started.set()
            release.wait(10)
        return row

    starter, start_result = in_thread(start_and_hold)
    assert started.wait(10)
    canceller, cancel_result = in_thread(lambda: TimeoutTask.objects.get(job_id=task.job_id).cancel())
    waiting_for_a_row_lock()
    release.set()
    starter.join(10), canceller.join(10)
    assert start_result["value"]["status"] == Status.DEAD
    assert cancel_result["value"] is True  # a DEAD task is discarded: its handler never runs
    assert reload(task).status == Status.CANCELLED and starts.count() == 0


# --- A real worker process ------------------------------------------------------------------------------

@contextmanager
def late_worker():
    """A Celery worker process of the test project, and the scan in this process publishing to it,
    both stopped when the block ends."""
    with processes.running_worker(env=processes.django_env(), name="worker-late-starts", concurrency=1):
        with processes.scanning(0.2):
            yield


def status(task):
    return reload(task).status


def durable_calls():
    """The runs of tests/testapp/tasks.py's DurableTask tasks, as (task_id, args as JSON)."""
    with connection.cursor() as cursor:
        cursor.execute(durable_tasks.CALLS_TABLE_SQL)
        cursor.execute("SELECT task_id, args::text FROM timeouts_test_call ORDER BY started_at")
        return cursor.fetchall()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_worker_process_skips_makes_dead_and_runs_after_a_requeue(broker, starts):
    durable_calls()
    sql("TRUNCATE timeouts_test_call")
    timeouts.set_limits("test.record", max_lateness=timedelta(seconds=5), on_late="skip")
    timeouts.set_limits("test.async", max_lateness=timedelta(seconds=5), on_late="dead")
    timeouts.set_limits("celery:tests.durable.record", max_lateness=timedelta(seconds=5), on_late="skip")
    skipped, dead = scheduled("test.record", "late", ago=60), scheduled("test.async", "late", ago=60)
    on_time = TimeoutTask.objects.schedule("test.record", "on-time", delay=0.5)
    late_call = durable_tasks.record.apply_async(("late",), countdown=60)
    sql("UPDATE timeouts_task SET action_time = action_time - interval '2 minutes', run_at = run_at - interval "
        "'2 minutes' WHERE biz_id = %s", [late_call.id])  # as if it had waited a minute past its eta
    call_on_time = durable_tasks.record.apply_async(("on time",), countdown=0.5)
    [late_row] = TimeoutTask.objects.filter(biz_id=late_call.id)
    with late_worker():
        processes.wait_for(lambda: status(on_time) == Status.DONE, 60, message="the task on time to run")
        processes.wait_for(lambda: (status(skipped), status(dead)) == (Status.CANCELLED, Status.DEAD), 60,
                           message="the late tasks to end")
        processes.wait_for(lambda: [task_id for task_id, _ in durable_calls()] == [call_on_time.id], 60,
                           message="the call on time to run")
        processes.wait_for(lambda: status(late_row) == Status.CANCELLED, 60, message="the late call to end")
        assert starts.count() == 1
        assert reload(dead).requeue() is True
        processes.wait_for(lambda: status(dead) == Status.DONE, 60, message="the requeued task to run")
    assert SKIPPED_TEXT.fullmatch(reload(skipped).last_error)
    assert reload(late_row).last_error.endswith("over max_lateness 5 s (on_late=skip)")
    assert sorted(row[0] for row in starts.all()) == sorted([on_time.job_id, dead.job_id])
    assert durable_calls() == [(call_on_time.id, '["on time"]')]
