"""The work of the tests of timeouts.testing.run_due (tests/integration/testing): handlers,
DurableTask calls and tasks of Django's tasks framework. run_due() runs them in the test's own
process, so each notes its run in RUNS; those that touch the demo's orders do it through Django's
connection, inside the test's transaction.

Imported by the test app's timeouts_handlers.py, so that every process registers them.
"""

from datetime import timedelta

from celery import shared_task
from django.db import connection

import timeouts
from project.orders.models import Order
from timeouts.celery import DurableTask

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task

# What ran, in order: (name, key, attempt) of a handler's task; (name, task_id, args, kwargs,
# retries) of a call; (name, args) of a Django task. The tests empty it.
RUNS = []
FAILING_ATTEMPTS = 3


@timeouts.handler("rundue.note")
def note(task):
    RUNS.append(("rundue.note", task.biz_id, task.attempts))


@timeouts.handler("rundue.other")
def note_other(task):
    RUNS.append(("rundue.other", task.biz_id, task.attempts))


@timeouts.handler("rundue.fail", max_attempts=FAILING_ATTEMPTS)
def fail(task):
    RUNS.append(("rundue.fail", task.biz_id, task.attempts))
    raise RuntimeError(f"failing on purpose (attempt {task.attempts})")


@timeouts.handler("rundue.follow")
def follow(task):
    """Schedules a rundue.note for attribute["next"] (a biz_id), attribute["delay"] seconds later."""
    RUNS.append(("rundue.follow", task.biz_id, task.attempts))
    timeouts.schedule("rundue.note", task.attribute["next"], delay=timedelta(seconds=task.attribute["delay"]))


@timeouts.handler("rundue.pay_then_fail", max_attempts=1)
def pay_then_fail(task):
    """Marks the order attribute["order"] paid, then raises."""
    Order.objects.filter(pk=task.attribute["order"]).update(paid=True)
    raise ValueError("failing after a write")


@timeouts.handler("rundue.break", max_attempts=1)
def break_a_statement(task):
    """Creates an order, then runs a statement that fails: the transaction refuses any other until
    it rolls back."""
    Order.objects.create(status=Order.Status.CLOSED)
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 / 0")


@shared_task(base=DurableTask, bind=True, name="tests.rundue.note")
def note_call(self, *args, **kwargs):
    RUNS.append((self.name, self.request.id, list(args), kwargs, self.request.retries))
    return list(args)


@shared_task(base=DurableTask, bind=True, name="tests.rundue.close_order")
def close_order_call(self, order_id):
    RUNS.append((self.name, self.request.id, [order_id], {}, self.request.retries))
    Order.objects.filter(pk=order_id, paid=False).update(status=Order.Status.CLOSED)


@shared_task(base=DurableTask, bind=True, name="tests.rundue.retry_once", max_retries=3)
def retry_once_call(self, countdown):
    """Runs, then asks to run again `countdown` seconds later, once."""
    RUNS.append((self.name, self.request.id, [countdown], {}, self.request.retries))
    if self.request.retries == 0:
        raise self.retry(countdown=countdown)


@shared_task(base=DurableTask, bind=True, name="tests.rundue.fail")
def fail_call(self):
    RUNS.append((self.name, self.request.id, [], {}, self.request.retries))
    raise RuntimeError("a call failing on purpose")


@task
def close_order_task(order_id):
    RUNS.append(("close_order_task", [order_id]))
    return Order.objects.filter(pk=order_id, paid=False).update(status=Order.Status.CLOSED)


@task
def failing_task(message):
    RUNS.append(("failing_task", [message]))
    raise RuntimeError(message)
