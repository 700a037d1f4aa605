"""Retry a statement that PostgreSQL aborted with SQLSTATE 40001.

Updating action_time moves a row to another partition; a concurrent UPDATE or FOR UPDATE of that
row then fails with "tuple to be locked was already moved to another partition" (40001). Running
the statement again finds the row where it is now.
"""

import random
import time

from django.db import OperationalError, transaction

SERIALIZATION_FAILURE = "40001"
ATTEMPTS = 8


def is_serialization_failure(exc) -> bool:
    return getattr(exc.__cause__, "sqlstate", None) == SERIALIZATION_FAILURE


def retry_on_conflict(func, *, using=None):
    """Call `func` in a savepoint (or its own transaction), again on 40001, a few times at most."""
    for attempt in range(ATTEMPTS):
        try:
            with transaction.atomic(using=using):
                return func()
        except OperationalError as exc:
            if not is_serialization_failure(exc) or attempt == ATTEMPTS - 1:
                raise
        time.sleep(random.uniform(0, 0.005 * 2**attempt))
