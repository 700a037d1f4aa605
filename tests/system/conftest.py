"""Fixtures of the system tests, which run real processes.

- `worker`: a real Celery worker (prefork, 2 processes) on the test database and broker.
"""

import pytest

from tests import processes


@pytest.fixture
def worker(transactional_db, broker):
    """A real Celery worker (prefork, 2 processes) on the test database and broker."""
    from project.celery import app

    broker.flushdb()
    process = processes.celery_worker(env=processes.django_env())
    try:
        processes.wait_for(lambda: app.control.ping(timeout=0.5), timeout=30, message="the Celery worker")
        yield process
    finally:
        processes.stop(process)
