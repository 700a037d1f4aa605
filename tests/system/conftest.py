"""Fixtures of the system tests, which run real processes.

- `worker`: a real Celery worker (prefork, 2 processes) on the test database and broker.
"""

import pytest

from tests import processes


@pytest.fixture
def worker(transactional_db, broker):
    """A real Celery worker (prefork, 2 processes) on the test database and broker."""
    broker.flushdb()
    process = processes.celery_worker(env=processes.django_env())
    try:
        processes.wait_for_worker(process)
        yield process
    finally:
        processes.stop(process)
