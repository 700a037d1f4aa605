"""What the business isolation tests share (limits, pauses, fair claiming)."""

import pytest
from django.db import connections


def forget_limits(aliases=("default",)):
    """timeouts_limits has no model, so Django's flush between tests leaves its rows: empty it (on
    each database of `aliases`)."""
    for alias in aliases:
        with connections[alias].cursor() as cursor:
            cursor.execute("TRUNCATE timeouts_limits")


@pytest.fixture
def no_limits(transactional_db):
    """No limits, pauses or declared values stored before the test, nor left for the next one."""
    forget_limits()
    yield
    forget_limits()
