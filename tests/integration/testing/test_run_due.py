"""timeouts.testing.run_due on a real PostgreSQL, inside the test's transaction: Django's TestCase
and pytest-django's `db`. What is due runs, oldest first, through the worker's start, retry, DONE
and DEAD; what a run schedules runs when it is due; cancelled, paused and future tasks do not run;
DurableTask calls and tasks of Django's tasks framework run in this process as well.
(test_run_due_shards.py: every shard; tests/unit/testing: bad arguments.)"""

import uuid
from datetime import timedelta

import pytest
from django.test import TestCase
from django.utils import timezone

import timeouts
from project.orders.models import Order
from tests.testapp import run_due_work as work
from timeouts.backends.compat import TaskResultStatus
from timeouts.models import TimeoutTask
from timeouts.testing import run_due

Status = TimeoutTask.Status
pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def runs():
    """What ran (run_due_work.RUNS), empty at the start of each test."""
    work.RUNS.clear()
    yield work.RUNS
    work.RUNS.clear()


def key(name="key") -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


def later(**delta):
    return timezone.now() + timedelta(**delta)


def row(task) -> TimeoutTask:
    return TimeoutTask.objects.get(job_id=task.job_id)


def rows_of_call(task_id) -> list[TimeoutTask]:
    return list(TimeoutTask.objects.filter(biz_id=task_id).order_by("created_at"))


class InATestCase(TestCase):
    """Inside Django's TestCase, whose transaction never commits."""

    def test_the_handler_sees_what_the_test_wrote_and_the_test_what_it_wrote(self):
        order = Order.objects.create()
        task = timeouts.schedule("order.close", order.pk, delay=0)

        self.assertEqual(run_due(), 1)

        order.refresh_from_db()
        self.assertEqual(order.status, Order.Status.CLOSED)
        done = row(task)
        self.assertEqual((done.status, done.attempts), (Status.DONE, 1))
        self.assertLessEqual(done.action_time, done.started_at)
        self.assertLessEqual(done.started_at, done.finished_at)

    def test_a_failing_handler_retries_after_its_backoff_then_is_dead(self):
        task = timeouts.schedule("rundue.fail", key(), delay=0)

        # The retry is due a backoff after the failure, later than this call runs to.
        self.assertEqual(run_due(), 1)
        retrying = row(task)
        self.assertEqual((retrying.status, retrying.attempts), (Status.PENDING, 1))
        self.assertIn("failing on purpose (attempt 1)", retrying.last_error)
        self.assertGreaterEqual(retrying.run_at, retrying.modified_at + timedelta(seconds=1))

        self.assertEqual(run_due(until=later(hours=1)), work.FAILING_ATTEMPTS - 1)
        dead = row(task)
        self.assertEqual((dead.status, dead.attempts), (Status.DEAD, work.FAILING_ATTEMPTS))
        self.assertIn(f"failing on purpose (attempt {work.FAILING_ATTEMPTS})", dead.last_error)
        self.assertEqual([attempt for *_, attempt in work.RUNS], [1, 2, 3])
        self.assertEqual(run_due(until=later(days=1)), 0)

    def test_what_a_handler_schedules_for_now_runs_in_the_same_call(self):
        first, then = key("first"), key("then")
        timeouts.schedule("rundue.follow", first, delay=0, attribute={"next": then, "delay": 0})

        self.assertEqual(run_due(), 2)
        self.assertEqual(work.RUNS, [("rundue.follow", first, 1), ("rundue.note", then, 1)])

    def test_what_a_handler_schedules_for_later_runs_when_until_reaches_it(self):
        first, then = key("first"), key("then")
        timeouts.schedule("rundue.follow", first, delay=0, attribute={"next": then, "delay": 600})

        self.assertEqual(run_due(), 1)
        self.assertEqual(run_due(until=later(minutes=5)), 0)
        self.assertEqual(run_due(until=later(minutes=11)), 1)
        self.assertEqual([name for name, *_ in work.RUNS], ["rundue.follow", "rundue.note"])

    def test_until_in_the_future_runs_future_tasks_and_in_the_past_fewer(self):
        now = timezone.now()
        keys = [key(f"in-{hours}h") for hours in (-3, -2, -1, 2)]
        for hours, biz_id in zip((-3, -2, -1, 2), keys, strict=True):
            timeouts.schedule("rundue.note", biz_id, at=now + timedelta(hours=hours))

        self.assertEqual(run_due(until=now - timedelta(minutes=150)), 1)
        self.assertEqual(run_due(until=now - timedelta(minutes=90)), 1)
        self.assertEqual(run_due(), 1)
        self.assertEqual(run_due(until=now + timedelta(hours=3)), 1)
        self.assertEqual([biz_id for _, biz_id, _ in work.RUNS], keys)
        # Run ahead of its time, a task records its start at its due time, never earlier.
        [ahead] = TimeoutTask.objects.filter(biz_id=keys[-1])
        self.assertEqual((ahead.status, ahead.started_at), (Status.DONE, ahead.action_time))

    def test_a_cancelled_task_never_runs(self):
        kept, cancelled = key("kept"), key("cancelled")
        timeouts.schedule("rundue.note", kept, delay=60)
        task = timeouts.schedule("rundue.note", cancelled, delay=60)
        self.assertTrue(task.cancel())

        self.assertEqual(run_due(until=later(days=1)), 1)
        self.assertEqual(work.RUNS, [("rundue.note", kept, 1)])
        self.assertEqual(row(task).status, Status.CANCELLED)

    def test_a_durable_task_call_runs_here_with_its_task_id_and_arguments(self):
        order = Order.objects.create()
        result = work.close_order_call.apply_async((order.pk,), countdown=1800)
        [stored] = rows_of_call(result.id)
        self.assertEqual(stored.status, Status.PENDING)

        self.assertEqual(run_due(), 0)
        self.assertEqual(run_due(until=later(minutes=31)), 1)

        self.assertEqual(work.RUNS, [(work.close_order_call.name, result.id, [order.pk], {}, 0)])
        order.refresh_from_db()
        self.assertEqual(order.status, Order.Status.CLOSED)
        done = row(stored)
        self.assertEqual(done.status, Status.DONE)
        self.assertGreaterEqual(done.started_at, done.action_time)

    def test_a_django_task_runs_here_and_its_result_reads_successful(self):
        order = Order.objects.create()
        result = work.close_order_task.enqueue(order.pk)

        self.assertEqual(run_due(), 1)

        done = work.close_order_task.get_result(result.id)
        self.assertEqual((done.status, done.return_value, done.attempts), (TaskResultStatus.SUCCESSFUL, 1, 1))
        order.refresh_from_db()
        self.assertEqual(order.status, Order.Status.CLOSED)

    def test_a_database_error_in_a_handler_leaves_the_tests_transaction_usable(self):
        orders = Order.objects.count()
        task = timeouts.schedule("rundue.break", key(), delay=0)

        self.assertEqual(run_due(), 1)

        dead = row(task)
        self.assertEqual(dead.status, Status.DEAD)
        self.assertIn("division by zero", dead.last_error)
        self.assertEqual(Order.objects.count(), orders)  # what the handler wrote is rolled back


# --- With pytest-django's `db` ---------------------------------------------------------------------

def test_the_oldest_task_runs_first(db):
    now = timezone.now()
    keys = {minutes: key(f"{minutes}-minutes-ago") for minutes in (1, 3, 2)}
    for minutes, biz_id in keys.items():
        timeouts.schedule("rundue.note", biz_id, at=now - timedelta(minutes=minutes))

    assert run_due() == 3
    assert [biz_id for _, biz_id, _ in work.RUNS] == [keys[3], keys[2], keys[1]]


def test_biz_type_runs_only_its_own_tasks(db):
    note, other = key("note"), key("other")
    timeouts.schedule("rundue.note", note, delay=0)
    left = timeouts.schedule("rundue.other", other, delay=0)

    assert run_due(biz_type="rundue.note") == 1
    assert work.RUNS == [("rundue.note", note, 1)]
    assert row(left).status == Status.PENDING
    assert run_due() == 1


def test_a_paused_biz_type_does_not_run_until_resumed(db):
    task = timeouts.schedule("rundue.note", key(), delay=0)
    timeouts.pause("rundue.note")

    assert run_due() == 0
    assert row(task).status == Status.PENDING
    timeouts.resume("rundue.note")
    assert run_due() == 1


def test_a_task_its_lateness_policy_skips_is_not_a_run(db):
    timeouts.set_limits("rundue.note", max_lateness=timedelta(seconds=2), on_late="skip")
    task = timeouts.schedule("rundue.note", key(), at=timezone.now() - timedelta(minutes=10))

    assert run_due() == 0
    assert work.RUNS == [] and row(task).status == Status.CANCELLED


def test_retries_are_counted_as_runs(db):
    timeouts.schedule("rundue.fail", key(), delay=0)
    timeouts.schedule("rundue.note", key(), delay=0)

    assert run_due(until=later(hours=1)) == work.FAILING_ATTEMPTS + 1


def test_a_handler_that_writes_then_raises_keeps_its_write(db):
    # As outside a transaction: only a database error rolls back what the handler wrote.
    order = Order.objects.create()
    task = timeouts.schedule("rundue.pay_then_fail", key(), delay=0, attribute={"order": order.pk})

    assert run_due() == 1
    order.refresh_from_db()
    assert order.paid
    assert row(task).status == Status.DEAD


def test_a_durable_call_keeps_its_task_id_args_and_kwargs(db):
    result = work.note_call.apply_async((1, "two"), {"three": [3]}, countdown=60)

    assert run_due(until=later(minutes=2)) == 1
    assert work.RUNS == [(work.note_call.name, result.id, [1, "two"], {"three": [3]}, 0)]


def test_a_durable_calls_retry_is_stored_with_its_task_id_and_runs_when_due(db):
    result = work.retry_once_call.apply_async((600,), countdown=60)

    assert run_due(until=later(minutes=2)) == 1
    first, retry = rows_of_call(result.id)
    assert first.status == Status.DONE and "retried" in first.last_error
    assert retry.status == Status.PENDING and retry.action_time > later(minutes=9)

    assert run_due(until=later(minutes=11)) == 1
    assert [(task_id, retries) for _, task_id, _, _, retries in work.RUNS] == [(result.id, 0), (result.id, 1)]
    assert row(retry).status == Status.DONE


def test_a_failing_durable_call_is_dead_and_run_due_goes_on(db):
    failing = work.fail_call.apply_async(countdown=60)
    after = work.note_call.apply_async(("after",), countdown=120)

    assert run_due(until=later(minutes=3)) == 2
    [dead] = rows_of_call(failing.id)
    assert dead.status == Status.DEAD and "a call failing on purpose" in dead.last_error
    assert [row.status for row in rows_of_call(after.id)] == [Status.DONE]


def test_an_expired_durable_call_is_cancelled_and_never_runs(db):
    result = work.note_call.apply_async(("expired",), countdown=60, expires=timezone.now() - timedelta(seconds=1))

    assert run_due(until=later(minutes=2)) == 0
    [cancelled] = rows_of_call(result.id)
    assert cancelled.status == Status.CANCELLED and "expired" in cancelled.last_error
    assert work.RUNS == []


def test_a_django_task_runs_at_its_run_after(db):
    order = Order.objects.create()
    result = work.close_order_task.using(run_after=later(hours=1)).enqueue(order.pk)

    assert run_due() == 0
    assert run_due(until=later(hours=2)) == 1
    assert work.close_order_task.get_result(result.id).status == TaskResultStatus.SUCCESSFUL


def test_a_failing_django_task_is_failed(db):
    result = work.failing_task.enqueue("failing on purpose")

    assert run_due() == 1
    failed = work.failing_task.get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED
    assert failed.errors[0].exception_class_path == "builtins.RuntimeError"

