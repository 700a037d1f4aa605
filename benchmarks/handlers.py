"""What the benchmark runs: a no-op timeouts handler and the same body as a plain Celery task.

Every start is written to the UNLOGGED table `timeouts_bench_start` through an autocommit psycopg
connection of the worker process's own (not Django's), so each start leaves one row whatever the
handler's transaction does, and a task started twice leaves two.

Only processes that import this module know these handlers: the bench itself (to schedule) and the
bench's Celery worker (`--include benchmarks.handlers`). The runtime never imports it.
"""

import os
import time
from datetime import timedelta

import psycopg
from celery import shared_task
from django.db import connection

import timeouts
from timeouts.celery import DurableTask

NOOP = "benchmarks.noop"  # biz_type of the measured tasks
PROBE = "benchmarks.probe"  # biz_type of the warm-up tasks sent through a path before measuring
DIRECT_TASK = "benchmarks.direct"  # the Celery-direct baseline: the same body, no timeouts
DURABLE_TASK = "benchmarks.durable"  # the same body again, on DurableTask (its eta/countdown calls are rows)
NEIGHBOUR = "benchmarks.neighbour"  # isolation: the biz_type due beside another's backlog
LIMITED = "benchmarks.limited"  # isolation: a biz_type with a rate limit
LIMITED_RATE = 200  # LIMITED's handler starts per second
SKIPPABLE = "benchmarks.skippable"  # late_recovery: a biz_type whose late tasks are skipped, not run
SKIP_AFTER = timedelta(seconds=5)  # ... when they would start more than this late
MUST_RUN = "benchmarks.must_run"  # late_recovery: a biz_type whose late tasks run (no lateness policy)
LATE_WORK_MS = "TIMEOUTS_BENCH_LATE_WORK_MS"  # environment: how long those two handlers work (sleep), in ms
SCALE = "benchmarks.scale"  # scale: the background rows, due after the scenario ends
CHURN = "benchmarks.churn"  # scale: the churn's tasks, most cancelled before they fall due
WARM_TASK = "benchmarks.warm"  # opens a worker process's connections before measuring
# DURABLE_TASK's lease (seconds): a call lost in a killed worker runs again this long after its start.
DURABLE_TTR = 10

START_TABLE_SQL = """
CREATE UNLOGGED TABLE IF NOT EXISTS timeouts_bench_start (
    job_id      bigint      NOT NULL,  -- timeouts: the task's job_id; Celery direct: the message's key
    attempt     integer     NOT NULL,
    action_time timestamptz NOT NULL,
    started_at  timestamptz NOT NULL,  -- timeouts: the worker's compare-and-set time (database clock)
    recorded_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    pid         integer     NOT NULL DEFAULT pg_backend_pid()
)
"""

_INSERT = (
    "INSERT INTO timeouts_bench_start (job_id, attempt, action_time, started_at) "
    "VALUES (%s, %s, %s::timestamptz, coalesce(%s::timestamptz, clock_timestamp()))"
)

_conn = None


def _connection():
    global _conn
    if _conn is None or _conn.closed:
        params = connection.get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        _conn = psycopg.connect(**params, autocommit=True)
    return _conn


def record(job_id, attempt, action_time, started_at=None):
    """One row per start; started_at None means "now" by the database clock."""
    _connection().execute(_INSERT, (job_id, attempt, action_time, started_at))


@timeouts.handler(NOOP)
def noop(task):
    record(task.job_id, task.attempts, task.action_time, task.started_at)


@timeouts.handler(PROBE)
def probe(task):
    _connection()


@timeouts.handler(NEIGHBOUR)
def neighbour(task):
    record(task.job_id, task.attempts, task.action_time, task.started_at)


@timeouts.handler(LIMITED, rate_limit=LIMITED_RATE)
def limited(task):
    record(task.job_id, task.attempts, task.action_time, task.started_at)


# What late_recovery's handlers do besides recording their start: wait, as a handler's I/O does
# (a push, an HTTP call), which a skipped task is spared.
_late_work = float(os.environ.get(LATE_WORK_MS) or 0) / 1000.0


@timeouts.handler(SKIPPABLE, max_lateness=SKIP_AFTER, on_late="skip")
def skippable(task):
    record(task.job_id, task.attempts, task.action_time, task.started_at)
    time.sleep(_late_work)


@timeouts.handler(MUST_RUN)
def must_run(task):
    record(task.job_id, task.attempts, task.action_time, task.started_at)
    time.sleep(_late_work)


@timeouts.handler(SCALE)
def scale(task):
    """Never meant to run within a run (scale.py counts the background rows that fell due)."""


@timeouts.handler(CHURN)
def churn(task):
    """The churn's tasks that were not cancelled: they run, unrecorded (the measured starts are NOOP's)."""


@shared_task(name=DIRECT_TASK, ignore_result=True)
def direct(key, action_time):
    """The baseline: the same recording, started by Celery itself (apply_async, with or without eta)."""
    record(key, 1, action_time)


@shared_task(name=DURABLE_TASK, base=DurableTask, ignore_result=True, ttr=DURABLE_TTR)
def durable(key, action_time):
    """`direct` on DurableTask: the same recording, for the Celery-ETA-against-DurableTask scenarios."""
    record(key, 1, action_time)


@shared_task(name=WARM_TASK, ignore_result=True)
def warm(key, sleep=0.05):
    """Open both connections a handler uses in this worker process, then record a negative key."""
    connection.ensure_connection()
    time.sleep(sleep)  # keeps this process busy so the next warm message goes to another one
    record(key, 1, "epoch")

