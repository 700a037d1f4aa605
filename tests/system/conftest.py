"""Fixtures of the system tests, which run real processes.

- `worker`: a real Celery worker (prefork, 2 processes) on the test database and broker.
- `runs`: what the DurableTask test tasks (tests/testapp/tasks.py) recorded of their runs.
"""

import json

import pytest
from django.db import connection

from tests import processes
from tests.testapp.tasks import CALLS_TABLE_SQL


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
