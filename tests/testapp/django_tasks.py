"""Tasks of Django's tasks framework for the tests of timeouts.backends.TimeoutsBackend. The
recording ones write each start (result id, attempt, worker, database clock), and the receivers
each signal, on a connection of their own, so a start leaves its trace whatever happens to the
worker afterwards."""

import asyncio
import os
import time

import psycopg
from django.db import connection
from psycopg.types.json import Jsonb

try:
    from django.tasks import task
    from django.tasks.signals import task_enqueued, task_finished, task_started
except ImportError:  # Django 5.2: the backport
    from django_tasks import task
    from django_tasks.signals import task_enqueued, task_finished, task_started

_conn = None


def _connection():
    """A connection of its own (autocommit, as the recorder's), which does not wait for the WAL
    flush at each commit: a killed worker loses nothing (only a crash of PostgreSQL would), and a
    task's start is not delayed by the test's own bookkeeping on a busy disk."""
    global _conn
    if _conn is None or _conn.closed or _conn.broken:
        params = connection.get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        _conn = psycopg.connect(**params, autocommit=True)
        _conn.execute("SET synchronous_commit = off")
    return _conn


def close():
    global _conn
    if _conn is not None:
        _conn.close()
        _conn = None


RUNS_TABLE_SQL = """
CREATE TABLE IF NOT EXISTS timeouts_test_django_task (
    result_id text NOT NULL,
    label jsonb NOT NULL,
    attempt integer NOT NULL,
    pid integer NOT NULL,
    started_at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""

SIGNALS_TABLE_SQL = """
CREATE TABLE IF NOT EXISTS timeouts_test_django_signal (
    result_id text NOT NULL,
    signal text NOT NULL,
    status text NOT NULL,
    attempts integer NOT NULL,
    errors integer NOT NULL,
    pid integer NOT NULL,
    sent_at timestamptz NOT NULL DEFAULT clock_timestamp()
)
"""


def _record_signal(name):
    def receiver(sender, task_result, **kwargs):
        # Only the tasks of this module (receivers see every backend's).
        if task_result.task.func.__module__ == __name__:
            _connection().execute(
                "INSERT INTO timeouts_test_django_signal (result_id, signal, status, attempts, errors, pid) "
                "VALUES (%s, %s, %s, %s, %s, %s)",
                (task_result.id, name, str(task_result.status), task_result.attempts, len(task_result.errors),
                 os.getpid()))

    return receiver


# Connected in every process that imports this module: the tests' and the workers' (a worker
# imports it when it runs one of these tasks, before it sends task_started).
_receivers = {name: _record_signal(name) for name in ("enqueued", "started", "finished")}
task_enqueued.connect(_receivers["enqueued"])
task_started.connect(_receivers["started"])
task_finished.connect(_receivers["finished"])


def _record(context, label):
    _connection().execute(
        "INSERT INTO timeouts_test_django_task (result_id, label, attempt, pid) VALUES (%s, %s, %s, %s)",
        (context.task_result.id, Jsonb(label), context.attempt, os.getpid()))


@task(takes_context=True)
def record(context, label):
    _record(context, label)
    return {"label": label, "attempt": context.attempt, "worker_ids": context.task_result.worker_ids}


@task(takes_context=True, queue_name="timeouts-test-other")
def record_elsewhere(context, label):
    _record(context, label)
    return label


@task
def add(x, y):
    return x + y


@task
def echo(*args, **kwargs):
    return {"args": list(args), "kwargs": kwargs}


@task
def returns(kind):
    """A return value JSON cannot carry, or one it can that is no object."""
    return {"set": {1, 2}, "nan": float("nan"), "none": None, "string": "text", "nul": "a\x00b"}[kind]


@task
async def async_add(x, y):
    await asyncio.sleep(0.01)
    return x + y


@task(takes_context=True)
async def async_record(context, label):
    _record(context, label)
    return context.attempt


class DetailedError(Exception):
    """An exception whose constructor takes more than a message, and that wraps another."""

    def __init__(self, code, details):
        super().__init__(f"failed with code {code}")
        self.code = code
        self.details = details


class UnprintableError(Exception):
    def __str__(self):
        raise RuntimeError("this exception cannot be shown")


@task(takes_context=True)
def fail(context, kind):
    _record(context, kind)
    if kind == "detailed":
        try:
            {}["missing"]
        except KeyError as cause:
            raise DetailedError(42, {"nested": [1, 2]}) from cause
    if kind == "unprintable":
        raise UnprintableError()
    raise ValueError(kind)


@task(takes_context=True)
def fail_until(context, succeeding_attempt):
    """Raises on each attempt before `succeeding_attempt`."""
    _record(context, succeeding_attempt)
    if context.attempt < succeeding_attempt:
        raise RuntimeError(f"attempt {context.attempt} fails")
    return context.attempt


@task(takes_context=True)
def sleep(context, seconds, attempts=None):
    """Sleeps on every attempt, or on the first `attempts` only; returns the attempt."""
    _record(context, seconds)
    if attempts is None or context.attempt <= attempts:
        time.sleep(seconds)
    return context.attempt
