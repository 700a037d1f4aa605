"""What the business isolation tests share (limits, pauses, fair claiming)."""

import pytest
from django.db import connection


def forget_limits():
    """timeouts_limits has no model, so Django's flush between tests leaves its rows: empty it."""
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE timeouts_limits")


@pytest.fixture
def no_limits(transactional_db):
    """No limits, pauses or declared values stored before the test, nor left for the next one."""
    forget_limits()
    yield
    forget_limits()
