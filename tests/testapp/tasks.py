"""Celery tasks of the tests that use `timeouts.celery.DurableTask`. Each records its run (task_id,
arguments, the queue it came from, the database clock) through the recorder's own connection, so a
run leaves its trace whatever happens to the worker afterwards."""

import json
import os
import time
from pathlib import Path

from celery import shared_task, signals
from celery.exceptions import Reject
from celery.signals import worker_ready
from psycopg.types.json import Jsonb

from timeouts.celery import DurableTask

from .recorder import _connection

CALLS_TABLE_SQL = """
CREATE TABLE IF NOT EXISTS timeouts_test_call (
    task_id text NOT NULL,
    name text NOT NULL,
    args jsonb NOT NULL,
    kwargs jsonb NOT NULL,
    routing_key text,
    retries integer NOT NULL,
    started_at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""


def record_call(task, args, kwargs):
    delivery = task.request.delivery_info or {}
    _connection().execute(
        "INSERT INTO timeouts_test_call (task_id, name, args, kwargs, routing_key, retries) "
        "VALUES (%s, %s, %s, %s, %s, %s)",
        (task.request.id, task.name, Jsonb(json.loads(json.dumps(args, default=str))),
         Jsonb(json.loads(json.dumps(kwargs, default=str))), delivery.get("routing_key"), task.request.retries),
    )


# A short lease, so that the calls a killed worker held run again within seconds.
@shared_task(base=DurableTask, bind=True, name="tests.durable.record", ttr=5)
def record(self, *args, **kwargs):
    record_call(self, args, kwargs)
    return list(args)


@shared_task(base=DurableTask, bind=True, name="tests.durable.add", ignore_result=False)
def add(self, x, y):
    record_call(self, [x, y], {})
    return x + y


@shared_task(base=DurableTask, bind=True, name="tests.durable.retry_once", max_retries=3)
def retry_once(self, countdown):
    """Runs, then asks to run again `countdown` seconds later, once."""
    record_call(self, [countdown], {})
    if self.request.retries == 0:
        raise self.retry(countdown=countdown)
    return "retried"


@shared_task(base=DurableTask, bind=True, name="tests.durable.fail")
def fail(self):
    record_call(self, [], {})
    raise RuntimeError("failing on purpose\x00")  # a NUL, which PostgreSQL's text cannot hold


@shared_task(base=DurableTask, bind=True, name="tests.durable.slow", ttr=3)
def slow(self, seconds):
    """Sleeps on its first run (so a test can kill its worker mid-run)."""
    first = _connection().execute("SELECT count(*) FROM timeouts_test_call WHERE task_id = %s",
                                  (self.request.id,)).fetchone()[0] == 0
    record_call(self, [seconds], {})
    if first:
        time.sleep(seconds)


@shared_task(base=DurableTask, bind=True, name="tests.durable.overrun", time_limit=1)
def overrun(self):
    """Runs past its hard time limit: Celery kills it."""
    record_call(self, [], {})
    time.sleep(10)


@shared_task(base=DurableTask, bind=True, name="tests.durable.longer_than_its_lease", ttr=1)
def longer_than_its_lease(self, seconds):
    """Runs for several of its (1 s) leases."""
    record_call(self, [seconds], {})
    time.sleep(seconds)


@shared_task(base=DurableTask, bind=True, name="tests.durable.short_lease", ttr=1)
def short_lease(self, *args):
    """Records its run; its lease (1 s) runs out soon unless something extends it."""
    record_call(self, args, {})


@shared_task(base=DurableTask, bind=True, name="tests.durable.reject")
def reject(self):
    record_call(self, [], {})
    raise Reject("rejecting on purpose", requeue=False)


@worker_ready.connect
def _say_ready(**_):
    """A test waiting for this worker (tests.support.processes.wait_for_worker) learns that it consumes."""
    path = os.environ.get("TIMEOUTS_TEST_WORKER_READY")  # tests.support.processes.READY_FILE
    if path:
        Path(path).touch()


SIGNALS_TABLE_SQL = """
CREATE TABLE IF NOT EXISTS timeouts_test_celery_signal (
    task_id text NOT NULL,
    signal text NOT NULL,
    detail text
)
"""


def _record_signal(name, detail_of=lambda **_: None):
    """A receiver that records the signal of each task of this module, where the settings ask for it
    (tests.settings_observed), on the recorder's own connection."""

    def receiver(sender=None, **kwargs):
        from django.conf import settings

        if not getattr(settings, "TIMEOUTS_TEST_RECORD_SIGNALS", False):
            return
        request = kwargs.get("request")
        task_id = kwargs.get("task_id") or getattr(request, "id", None) or getattr(sender.request, "id", None)
        _connection().execute("INSERT INTO timeouts_test_celery_signal (task_id, signal, detail) VALUES (%s, %s, %s)",
                              (task_id, name, detail_of(sender=sender, **kwargs)))

    return receiver


# task_received: the kind of message the request came in (Celery's own, or one call of several).
_signal_receivers = {"received": _record_signal("received", lambda request, **_: type(request.message).__name__),
                     "prerun": _record_signal("prerun"), "postrun": _record_signal("postrun"),
                     "success": _record_signal("success"), "failure": _record_signal("failure")}
signals.task_received.connect(_signal_receivers["received"])
signals.task_prerun.connect(_signal_receivers["prerun"])
signals.task_postrun.connect(_signal_receivers["postrun"])
signals.task_success.connect(_signal_receivers["success"])
signals.task_failure.connect(_signal_receivers["failure"])
