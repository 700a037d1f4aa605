"""Fixtures shared by the layers. None is autouse and none needs a service until a test asks for it,
so tests/unit runs with no PostgreSQL and no broker:

- `django_db_setup` (session): pytest-django's test database, plus the table the test handlers
  record their starts in.
- `starts`: those recorded starts, emptied for each test (needs the database).
- `broker` (session): the test broker, emptied before and after.
"""

import pytest
import redis
from django.conf import settings
from django.db import connection

from tests.testapp import recorder
from tests.testapp.recorder import TABLE_SQL


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(TABLE_SQL)
    yield


@pytest.fixture
def starts(transactional_db):
    """Rows the test handlers recorded: list of (job_id, attempt, action_time, started_at)."""

    class Starts:
        def all(self):
            with connection.cursor() as cursor:
                cursor.execute("SELECT job_id, attempt, action_time, started_at FROM timeouts_test_start "
                               "ORDER BY started_at")
                return cursor.fetchall()

        def count(self):
            with connection.cursor() as cursor:
                cursor.execute("SELECT count(*) FROM timeouts_test_start")
                return cursor.fetchone()[0]

    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE timeouts_test_start")
    yield Starts()
    recorder.close()


@pytest.fixture(scope="session")
def broker():
    """The test broker (a Redis database of its own), emptied before use.

    With another transport (bin/test's filesystem:// fallback when no Redis runs) this is a stand-in
    whose flushdb() empties the transport's message folders (and does nothing for other transports)."""
    if settings.CELERY_BROKER_URL.startswith(("redis://", "rediss://", "unix://")):
        client = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    else:
        client = _FolderBroker(getattr(settings, "CELERY_BROKER_TRANSPORT_OPTIONS", None) or {})
    client.flushdb()
    yield client
    client.flushdb()


class _FolderBroker:
    def __init__(self, options):
        self.folders = {options[key] for key in ("data_folder_in", "data_folder_out") if options.get(key)}

    def flushdb(self):
        import pathlib

        for folder in self.folders:
            for message in pathlib.Path(folder).glob("*.msg"):
                message.unlink(missing_ok=True)
        return True
