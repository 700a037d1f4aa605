"""The work of the conformance suite (tests/conformance), in each kind timeouts runs: a handler, a
DurableTask call and a task of Django's tasks framework. All three do the same thing through
`perform()`: record the start on a connection of their own (so a run leaves its trace whatever
happens to its process afterwards), then sleep or fail as the test asked.

Imported by the test app's timeouts_handlers.py and tasks.py, so that the handler is registered and
the Celery task bound in every process, the workers' included.
"""

import os
import time

from celery import shared_task

import timeouts
from timeouts.celery import DurableTask

from .recorder import _connection

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task

TABLE_SQL = """
CREATE TABLE IF NOT EXISTS timeouts_test_conformance (
    kind text NOT NULL,
    key text NOT NULL,
    pid integer NOT NULL,  -- the process that ran it, for a test that kills it
    started_at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""

# Short leases, so that what a test does to a lease (a busy pool, a killed process) shows within seconds.
TTR = 3
# A failing run is retried once where the kind retries (a handler, a Django task), then DEAD.
MAX_ATTEMPTS = 2
HANDLER = "conformance.run"
# Occupies a pool process for a while, under a lease long enough never to run out meanwhile.
BLOCKER = "conformance.block"
# The backend of tests/settings.py's TASKS that runs the conformance suite's Django tasks.
TASKS_BACKEND = "conformance"


def perform(kind, key, behaviour):
    """What every kind's work does: record the start, then `behaviour` ({"sleep": seconds on the
    first run, "fail": True})."""
    first = _connection().execute("SELECT count(*) = 0 FROM timeouts_test_conformance WHERE kind = %s AND key = %s",
                                  (kind, key)).fetchone()[0]
    _connection().execute("INSERT INTO timeouts_test_conformance (kind, key, pid) VALUES (%s, %s, %s)",
                          (kind, key, os.getpid()))
    if first and behaviour.get("sleep"):
        time.sleep(behaviour["sleep"])
    if behaviour.get("fail"):
        raise RuntimeError(f"{kind} {key} failing on purpose")


@timeouts.handler(HANDLER, ttr=TTR, max_attempts=MAX_ATTEMPTS)
def run_handler(task):
    perform("handler", task.biz_id, task.attribute)


@timeouts.handler(BLOCKER, ttr=60)
def block(task):
    time.sleep(task.attribute["sleep"])


@shared_task(base=DurableTask, bind=True, name="tests.conformance.run", ttr=TTR)
def run_call(self, behaviour):
    perform("durable", self.request.id, behaviour)


@task(backend=TASKS_BACKEND, takes_context=True)
def run_django_task(context, key, behaviour):
    perform("django_task", key, behaviour)
