"""Fixtures of the system tests, which run real processes.

- `worker`: a real Celery worker (prefork, 2 processes) on the test database and broker.
- `runs`: what the DurableTask test tasks (tests/testapp/tasks.py) recorded of their runs.

What most of these tests check (workers, dispatchers, brokers, leases) does not depend on Django's
version: bin/test's second leg (Django 6.0) leaves out the tests marked `one_leg`. Each module of
this folder is named in one of three lists below, which say where its tests run; a module in none
of them stops the collection, so that a new one runs where its author chose.
"""

import json
from pathlib import Path

import pytest
from django.db import connection

from tests.support import processes
from tests.testapp.tasks import CALLS_TABLE_SQL

HERE = Path(__file__).resolve().parent
# Every test marked one_leg: workers, dispatchers, brokers, shards, limits, metrics and the
# distributions, which do not depend on Django's version.
ONE_LEG = {"test_async_handlers", "test_batch_worker_crash", "test_call_starts", "test_carried_calls", "test_celery",
           "test_dispatcher",
           "test_dispatcher_faults", "test_distributions", "test_durable_publishing", "test_durable_task",
           "test_isolation", "test_metrics_prefork", "test_on_rabbitmq", "test_shards"}
# Both legs: the admin's pages, a host project installing the package, Django's tasks framework
# (built in on 6.0, the backport on 5.2), and timeouts' own copy of Django's database connection.
BOTH_LEGS = {"test_admin_browser", "test_admin_businesses_browser", "test_host_project", "test_tasks_backend",
             "test_own_connection"}
# Marked test by test: the demo's smoke test runs in both legs, its broker fallbacks in one; the
# bench's tiny runs in one, but that of the backend of Django's tasks framework.
EACH_TEST_SAYS = {"test_bench", "test_demo"}


def pytest_collection_modifyitems(items):
    for item in items:
        if item.path.parent != HERE:
            continue
        module = item.path.stem
        if module in ONE_LEG:
            item.add_marker(pytest.mark.one_leg)
        elif module not in BOTH_LEGS | EACH_TEST_SAYS:
            raise pytest.UsageError(f"tests/system/{module}.py: name it in ONE_LEG, BOTH_LEGS or EACH_TEST_SAYS "
                                    "of tests/system/conftest.py, which say where its tests run")


@pytest.fixture
def worker(transactional_db, broker):
    """A real Celery worker (prefork, 2 processes) on the test database and broker."""
    broker.flushdb()
    with processes.running_worker(env=processes.django_env()) as process:
        yield process


@pytest.fixture
def runs(transactional_db):
    """The runs the test tasks recorded: (task_id, name, args, kwargs, routing_key, retries, started_at)."""

    class Runs:
        def all(self, name=None):
            with connection.cursor() as cursor:
                cursor.execute("SELECT task_id, name, args, kwargs, routing_key, retries, started_at "
                               "FROM timeouts_test_call WHERE %s IS NULL OR name = %s ORDER BY started_at",
                               [name, name])
                # Django reads jsonb as text (its JSONField parses it).
                return [(task_id, name, json.loads(args), json.loads(kwargs), *rest)
                        for task_id, name, args, kwargs, *rest in cursor.fetchall()]

        def count(self, name=None):
            return len(self.all(name))

    with connection.cursor() as cursor:
        cursor.execute(CALLS_TABLE_SQL)
        cursor.execute("TRUNCATE timeouts_test_call")
    yield Runs()
