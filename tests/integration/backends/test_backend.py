"""TimeoutsBackend, Django's tasks framework's backend, on a real PostgreSQL: enqueue and
get_result, the stored result of each outcome, retries, bad input, cancel and retention. A task is
run in this process as a worker runs it (claim, then the `timeouts.run` message's call of
running.run); tests/system/test_tasks_backend.py runs them in real worker processes."""

import asyncio
import json
from datetime import UTC, datetime, timedelta

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import connection, transaction
from django.test import override_settings

from tests.testapp import django_tasks as tasks
from timeouts.backends import Cancelled, InvalidTaskArguments, InvalidTaskOptions, LeaseExpired, cancel
from timeouts.backends.compat import InvalidTask, TaskResultDoesNotExist, TaskResultStatus, task_backends
from timeouts.dispatch.claiming import claim_due
from timeouts.errors import TimeoutsError
from timeouts.models import TimeoutTask
from timeouts.storage import partitions
from timeouts.store.recovery import recover_expired
from timeouts.worker import attempt, running

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]
Status = TimeoutTask.Status


@pytest.fixture(autouse=True)
def tables(transactional_db):
    with connection.cursor() as cursor:
        cursor.execute(tasks.RUNS_TABLE_SQL)
        cursor.execute(tasks.SIGNALS_TABLE_SQL)
        cursor.execute("TRUNCATE timeouts_test_django_task, timeouts_test_django_signal")
    yield
    tasks.close()


def run_due() -> list[str]:
    """What a worker does with the due tasks' messages; their outcomes."""
    return [running.run(claim.fence) for claim in claim_due(100)]


def make_due_now(result):
    """Skip a retry's backoff."""
    with connection.cursor() as cursor:
        cursor.execute("UPDATE timeouts_task SET run_at = action_time WHERE job_id = %s",
                       [int(result.id.split("-")[0])])


def signals(result_id):
    with connection.cursor() as cursor:
        cursor.execute("SELECT signal, status, attempts, errors FROM timeouts_test_django_signal "
                       "WHERE result_id = %s ORDER BY sent_at", [result_id])
        return cursor.fetchall()


def rows():
    return TimeoutTask.objects.filter(biz_type__startswith="tasks:")


# --- Enqueue and results ---------------------------------------------------------------------------

def test_a_result_round_trip_from_ready_to_successful():
    result = tasks.add.enqueue(2, 3)
    assert result.status == TaskResultStatus.READY and result.backend == "default"
    assert result.args == [2, 3] and result.kwargs == {} and result.worker_ids == [] and result.errors == []
    fetched = tasks.add.get_result(result.id)
    assert fetched.status == TaskResultStatus.READY and fetched.task == tasks.add and fetched.id == result.id
    [row] = rows()
    assert (row.biz_type, row.biz_id, row.max_attempts) == ("tasks:default:default", tasks.add.module_path, 1)

    assert run_due() == ["done"]
    done = tasks.add.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL and done.return_value == 5 and done.is_finished
    assert done.attempts == 1 and len(done.worker_ids) == 1 and done.errors == []
    assert done.enqueued_at <= done.started_at == done.last_attempted_at <= done.finished_at
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 5


@pytest.mark.parametrize(("kind", "expected"), [("none", None), ("string", "text")])
def test_return_values_json_can_carry(kind, expected):
    result = tasks.returns.enqueue(kind)
    run_due()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == expected


def test_arguments_and_return_values_are_normalised_as_django_does():
    result = tasks.echo.enqueue((1, 2), [3], b"bytes", key={"nested": (4,)})
    assert result.args == [[1, 2], [3], "bytes"] and result.kwargs == {"key": {"nested": [4]}}
    run_due()
    result.refresh()
    assert result.return_value == {"args": [[1, 2], [3], "bytes"], "kwargs": {"key": {"nested": [4]}}}


@pytest.mark.parametrize(("kind", "error"), [("set", "builtins.TypeError"), ("nan", "builtins.ValueError"),
                                             ("nul", "builtins.ValueError")])
def test_a_return_value_json_cannot_carry_fails_the_task(kind, error):
    result = tasks.returns.enqueue(kind)
    assert run_due() == ["dead"]
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class_path for e in result.errors] == [error]
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018


def test_a_failing_task_records_its_exception_class_and_traceback():
    detailed = tasks.fail.enqueue("detailed")
    unprintable = tasks.fail.enqueue("unprintable")
    assert run_due() == ["dead", "dead"]
    detailed.refresh()
    unprintable.refresh()
    assert detailed.status == unprintable.status == TaskResultStatus.FAILED
    [error] = detailed.errors
    assert error.exception_class is tasks.DetailedError
    assert "KeyError" in error.traceback and "failed with code 42" in error.traceback  # the cause, and it
    assert "tests/testapp/django_tasks.py" in error.traceback
    [error] = unprintable.errors
    assert error.exception_class is tasks.UnprintableError and "UnprintableError" in error.traceback
    assert detailed.finished_at is not None and detailed.attempts == 1


def test_the_context_carries_the_result_and_the_attempt():
    result = tasks.record.enqueue("hello")
    run_due()
    result.refresh()
    assert result.return_value["label"] == "hello" and result.return_value["attempt"] == 1
    assert result.return_value["worker_ids"] == result.worker_ids and len(result.worker_ids) == 1


def test_async_tasks_run_and_return():
    added = tasks.async_add.enqueue(1, 2)
    recorded = tasks.async_record.enqueue("async")
    assert run_due() == ["done", "done"]
    assert tasks.async_add.get_result(added.id).return_value == 3
    assert tasks.async_record.get_result(recorded.id).return_value == 1


def test_aenqueue_and_aget_result():
    result = async_to_sync(tasks.add.aenqueue)(4, 5)
    assert result.status == TaskResultStatus.READY
    run_due()
    fetched = async_to_sync(tasks.add.aget_result)(result.id)
    assert fetched.return_value == 9
    async_to_sync(result.arefresh)()
    assert result.status == TaskResultStatus.SUCCESSFUL


def test_signals_enqueued_started_and_finished():
    ok = tasks.record.enqueue("signals")
    failed = tasks.fail.enqueue("boom")
    run_due()
    assert signals(ok.id) == [("enqueued", "READY", 0, 0), ("started", "RUNNING", 1, 0),
                              ("finished", "SUCCESSFUL", 1, 0)]
    assert signals(failed.id) == [("enqueued", "READY", 0, 0), ("started", "RUNNING", 1, 0),
                                  ("finished", "FAILED", 1, 1)]


def test_enqueue_inside_atomic_is_transactional():
    with pytest.raises(RuntimeError), transaction.atomic():
        rolled_back = tasks.record.enqueue("rolled back")
        raise RuntimeError
    assert not rows().exists() and signals(rolled_back.id) == []
    with transaction.atomic():
        kept = tasks.record.enqueue("kept")
        assert signals(kept.id) == []  # sent once the task exists for everyone
    assert signals(kept.id) == [("enqueued", "READY", 0, 0)]
    with pytest.raises(TaskResultDoesNotExist):
        tasks.record.get_result(rolled_back.id)
    assert run_due() == ["done"]


def test_run_after_is_the_due_time():
    later = datetime.now(UTC) + timedelta(minutes=5)
    result = tasks.add.using(run_after=later).enqueue(1, 1)
    [row] = rows()
    assert row.action_time == row.run_at == later
    assert run_due() == [] and claim_due(100, lead=600)  # due in five minutes, not before
    assert tasks.add.get_result(result.id).task.run_after == later


def test_a_task_the_worker_cannot_load_fails_with_the_reason():
    result = tasks.add.enqueue(1, 2)
    with connection.cursor() as cursor:  # as if the function had been removed since
        cursor.execute("UPDATE timeouts_task SET attribute = jsonb_set(attribute, '{task}', '\"tests.gone\"')")
    assert run_due() == ["dead"]
    [row] = rows()
    assert row.status == Status.DEAD and "ImportError" in row.last_error
    with connection.cursor() as cursor:
        cursor.execute("SELECT errors->0->>'exception_class_path' FROM timeouts_task WHERE job_id = %s",
                       [int(result.id.split("-")[0])])
        assert cursor.fetchone()[0] == "builtins.ImportError"


def test_a_task_in_the_default_partition_runs_and_reports_back():
    result = tasks.record.using(run_after=datetime.now(UTC) - timedelta(days=60)).enqueue("old")  # no partition
    with connection.cursor() as cursor:
        cursor.execute("SELECT tableoid::regclass::text FROM timeouts_task")
        assert cursor.fetchone()[0] == "timeouts_task_default"
    assert run_due() == ["done"]
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and len(result.worker_ids) == 1


def test_an_eager_run_inside_a_transaction_leaves_it_usable():
    # As a host's test suite runs a task (task_always_eager) inside its own transaction: no
    # statement may fail there, not even on a partition that does not exist.
    result = tasks.record.using(run_after=datetime.now(UTC) - timedelta(days=60)).enqueue("eager")
    [claim] = claim_due(100)
    with transaction.atomic():
        assert running.run(claim.fence) == "done"
        assert tasks.record.get_result(result.id).status == TaskResultStatus.SUCCESSFUL


# --- Retries ---------------------------------------------------------------------------------------

def test_max_attempts_retries_with_backoff_then_succeeds():
    result = tasks.fail_until.using(backend="retrying").enqueue(3)
    assert run_due() == ["retry"]
    result.refresh()
    assert result.status == TaskResultStatus.READY and result.attempts == 1 and len(result.errors) == 1
    assert run_due() == []  # waits out its backoff
    make_due_now(result)
    assert run_due() == ["retry"]
    make_due_now(result)
    assert run_due() == ["done"]
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 3
    assert result.attempts == 3 and len(result.worker_ids) == 3
    assert [e.exception_class_path for e in result.errors] == ["builtins.RuntimeError"] * 2
    assert "attempt 2 fails" in result.errors[1].traceback
    assert [s[:3] for s in signals(result.id)] == [
        ("enqueued", "READY", 0), ("started", "RUNNING", 1), ("started", "RUNNING", 2), ("started", "RUNNING", 3),
        ("finished", "SUCCESSFUL", 3)]


def test_the_last_failed_attempt_fails_the_task():
    result = tasks.fail_until.using(backend="retrying").enqueue(10)
    for _ in range(3):
        make_due_now(result)
        run_due()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and result.attempts == 3 and len(result.errors) == 3
    assert [s[:2] for s in signals(result.id)][-1] == ("finished", "FAILED")


def test_an_attempt_whose_lease_ran_out_shows_as_lease_expired():
    result = tasks.record.enqueue("lost")
    [claim] = claim_due(100)
    attempt.start({"job_id": claim.job_id, "action_time": claim.action_time}, claim.attempt)  # then the worker dies
    assert tasks.record.get_result(result.id).status == TaskResultStatus.RUNNING
    with connection.cursor() as cursor:
        cursor.execute("UPDATE timeouts_task SET lease_until = clock_timestamp() WHERE job_id = %s", [claim.job_id])
    recover_expired()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and result.attempts == 1
    [error] = result.errors
    assert error.exception_class is LeaseExpired and "lease" in error.traceback


# --- Bad input -------------------------------------------------------------------------------------

@pytest.mark.parametrize(("args", "kwargs"), [
    ((object(),), {}), ((datetime.now(UTC),), {}), ((float("nan"),), {}), (("a\x00b",), {}),
    ((), {"big": "x" * 70_000}), ((), {"nested": {1.5j: 1}}),
])
def test_arguments_json_cannot_carry_raise_and_store_nothing(args, kwargs):
    with pytest.raises(InvalidTaskArguments, match="arguments of tests.testapp.django_tasks.echo") as raised:
        tasks.echo.enqueue(*args, **kwargs)
    assert isinstance(raised.value, InvalidTask) and isinstance(raised.value, TimeoutsError)
    assert not rows().exists()


def test_an_unknown_queue_a_priority_or_a_naive_run_after_is_refused():
    with pytest.raises(InvalidTaskOptions, match="serves the queues default, timeouts-test-other"):
        tasks.add.using(queue_name="nowhere")
    with pytest.raises(InvalidTaskOptions, match="priority"):
        tasks.add.using(priority=10)
    with pytest.raises(InvalidTaskOptions, match="aware"):
        tasks.add.using(run_after=datetime.now())  # noqa: DTZ005
    with pytest.raises(InvalidTask):
        tasks.add.using(backend="retrying", queue_name="timeouts-test-other")

    def not_at_module_level():
        return 1

    with pytest.raises(InvalidTaskOptions, match="module level"):
        tasks.task(not_at_module_level)
    assert not rows().exists()


def test_bad_backend_settings_are_refused():
    from django.core.exceptions import ImproperlyConfigured

    for options in ({"MAX_ATTEMPTS": 0}, {"TTR": "60"}, {"RETRIES": 3}):
        with override_settings(TASKS={"default": {"BACKEND": "timeouts.backends.TimeoutsBackend",
                                                  "OPTIONS": options}}), pytest.raises(ImproperlyConfigured):
            task_backends["default"]
    with override_settings(TASKS={"default": {"BACKEND": "timeouts.backends.TimeoutsBackend", "QUEUES": []}}), \
            pytest.raises(ImproperlyConfigured, match="QUEUES"):
        task_backends["default"]


# --- get_result ------------------------------------------------------------------------------------

def test_get_result_reads_one_partition():
    result = tasks.add.enqueue(1, 2)
    job_id, micros = result.id.split("-")
    with connection.cursor() as cursor:
        from timeouts.backends.queues import PREFIX
        from timeouts.backends.results import parse_result_id
        from timeouts.store.queries import QUERIES

        cursor.execute("EXPLAIN (FORMAT JSON) " + QUERIES["tasks_backend_result"],
                       {**parse_result_id(result.id), "prefix": PREFIX})
        plan = json.dumps(cursor.fetchone()[0])
    assert plan.count('"Relation Name"') == 1, plan


def test_unknown_malformed_and_foreign_ids():
    with pytest.raises(TaskResultDoesNotExist, match="not a result id"):
        task_backends["default"].get_result("not-an-id")
    with pytest.raises(TaskResultDoesNotExist, match="does not exist"):
        task_backends["default"].get_result(f"999999999-{int(datetime.now(UTC).timestamp() * 1e6)}")
    result = tasks.add.using(backend="retrying").enqueue(1, 2)
    with pytest.raises(TaskResultDoesNotExist, match="another backend"):
        task_backends["default"].get_result(result.id)


def test_a_result_past_retention_says_it_expired():
    now = datetime.now(UTC)
    due = now - timedelta(days=20)
    with override_settings(TIMEOUTS={"RETENTION": timedelta(days=7), "PARTITIONS_AHEAD": 2}):
        partitions.maintain(now=due)  # the partition of its day, as it was then
        result = tasks.add.using(run_after=due).enqueue(1, 2)
        assert run_due() == ["done"]
        assert tasks.add.get_result(result.id).return_value == 3
        report = partitions.maintain(now=now)
        assert report.dropped
        with pytest.raises(TaskResultDoesNotExist, match="has expired.*RETENTION"):
            tasks.add.get_result(result.id)


def test_a_failed_task_an_operator_discards_says_so():
    result = tasks.fail.enqueue("discarded")
    run_due()
    [row] = rows()
    assert row.cancel()  # the admin's cancel of a DEAD task
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert [e.exception_class for e in result.errors] == [ValueError, Cancelled]
    assert "discarded" in result.errors[-1].traceback


def test_a_requeued_task_is_found_by_its_first_id():
    result = tasks.fail.enqueue("once")
    run_due()
    [row] = rows()
    assert row.status == Status.DEAD and row.requeue()
    assert tasks.fail.get_result(result.id).status == TaskResultStatus.READY


# --- cancel ----------------------------------------------------------------------------------------

def test_cancel_before_it_starts_means_it_never_runs():
    result = tasks.record.using(run_after=datetime.now(UTC) + timedelta(minutes=1)).enqueue("cancelled")
    assert cancel(result.id) is True
    assert cancel(result) is False  # once
    result.refresh()
    assert result.status == TaskResultStatus.FAILED and result.errors[-1].exception_class is Cancelled
    assert claim_due(100, lead=120) == []


def test_cancel_after_it_ran_or_while_claimed():
    ran = tasks.add.enqueue(1, 1)
    run_due()
    assert cancel(ran.id) is False
    claimed = tasks.record.enqueue("claimed")
    [claim] = claim_due(100)
    assert cancel(claimed.id) is True  # claimed, not started: the compare-and-set then matches nothing
    assert running.run(claim.fence) == "dropped"
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM timeouts_test_django_task")
        assert cursor.fetchone()[0] == 0


def test_cancel_inside_a_rolled_back_transaction_cancels_nothing():
    result = tasks.record.enqueue("kept")
    with pytest.raises(RuntimeError), transaction.atomic():
        assert cancel(result.id) is True
        raise RuntimeError
    assert run_due() == ["done"]


def close_this_threads_connections():
    connection.close()


def test_async_enqueue_in_an_event_loop():
    async def enqueue_two():
        try:
            return await asyncio.gather(tasks.add.aenqueue(1, 1), tasks.async_add.aenqueue(2, 2))
        finally:  # the connection of the thread that ran them
            await sync_to_async(close_this_threads_connections, thread_sensitive=True)()

    first, second = asyncio.run(enqueue_two())
    assert run_due() == ["done", "done"]
    assert tasks.add.get_result(first.id).return_value == 2 and tasks.async_add.get_result(second.id).return_value == 4
