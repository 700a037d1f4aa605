"""Handlers for the tests. Each records its start (job id, attempt, database clock) through its own
autocommit connection, outside the system under test, so a rolled-back or crashed handler still
leaves its trace."""

import asyncio
import os
import time

from asgiref.sync import sync_to_async

import timeouts
from timeouts.models import TimeoutTask
from timeouts.store import worker_connection

from . import (
    conformance,  # noqa: F401  (registers the conformance suite's handlers)
    oracle_handlers,  # noqa: F401  (registers the reliability scenarios' handlers)
    run_due_work,  # noqa: F401  (registers the work of the run_due tests)
)
from .recorder import record, record_connections


@timeouts.handler("test.record")
def record_start(task):
    record(task)


@timeouts.handler("test.fail", max_attempts=2)
def always_fail(task):
    record(task)
    raise RuntimeError(f"failing on purpose (attempt {task.attempts})")


@timeouts.handler("test.slow", ttr=3)
def slow_first_time(task):
    """Hangs on its first attempt (so a test can kill its worker mid-handler), then succeeds."""
    record(task)
    if task.attempts == 1:
        time.sleep(float(task.attribute.get("sleep", 30)))


@timeouts.handler("test.crash", max_attempts=2, ttr=2)
def crash_own_process(task):
    record(task)
    os._exit(1)


@timeouts.handler("test.queued", queue="timeouts-test-other")
def on_other_queue(task):
    record(task)


@timeouts.handler("test.connections")
def record_connections_used(task):
    """Records the server process behind timeouts' statements and the one behind the handler's ORM."""
    record_connections(task, worker_connection.current())


@timeouts.handler("test.async")
async def record_start_async(task):
    """Awaits, reads its own row through Django's async ORM, then records: a start recorded means
    the whole body ran."""
    await asyncio.sleep(0.01)
    row = await TimeoutTask.objects.aget(job_id=task.job_id, action_time=task.action_time)
    if row.status != TimeoutTask.Status.RUNNING:
        raise AssertionError(f"the handler runs while its task is RUNNING, not {row.get_status_display()}")
    await sync_to_async(record)(task)


@timeouts.handler("test.async_fail", max_attempts=2)
async def always_fail_async(task):
    await sync_to_async(record)(task)
    await asyncio.sleep(0)
    raise RuntimeError(f"failing on purpose in a coroutine (attempt {task.attempts})")
