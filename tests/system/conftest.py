"""Fixtures of the system tests, which run real processes.

- `worker`: a real Celery worker (prefork, 2 processes) on the test database and broker.
- `runs`: what the DurableTask test tasks (tests/testapp/tasks.py) recorded of their runs.

What most of these tests check (workers, dispatchers, brokers, leases) does not depend on Django's
version: they are marked `one_leg` and run in bin/test's first leg only, except the modules of
DJANGO_VERSION_MATTERS, which run in both.
"""

import json
from pathlib import Path

import pytest
from django.db import connection

from tests.support import processes
from tests.testapp.tasks import CALLS_TABLE_SQL

HERE = Path(__file__).resolve().parent
# The admin's pages, a host project installing the package, Django's tasks framework (built in on
# 6.0, the backport on 5.2), and timeouts' own copy of Django's database connection.
DJANGO_VERSION_MATTERS = {"test_admin_browser", "test_admin_businesses_browser", "test_host_project",
                          "test_tasks_backend", "test_own_connection"}


def pytest_collection_modifyitems(items):
    for item in items:
        if item.path.parent == HERE and item.path.stem not in DJANGO_VERSION_MATTERS:
            item.add_marker(pytest.mark.one_leg)


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
