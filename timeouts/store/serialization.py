"""Retry a statement that PostgreSQL aborted with SQLSTATE 40001.

Updating action_time moves a row to another partition; a concurrent UPDATE or FOR UPDATE of that
row then fails with "tuple to be locked was already moved to another partition" (40001). Running
the statement again finds the row where it is now.
"""

import random
import time

from django.db import DEFAULT_DB_ALIAS, OperationalError, connections, transaction

SERIALIZATION_FAILURE = "40001"
ATTEMPTS = 8


def is_serialization_failure(exc) -> bool:
    return getattr(exc.__cause__, "sqlstate", None) == SERIALIZATION_FAILURE


def retry_on_conflict(func, *, using=None):
    """Call `func` (one statement), again on 40001, a few times at most.

    Outside a transaction the statement is its own transaction and simply runs again. Inside the
    caller's transaction it runs in a savepoint, so the failure does not abort the caller's work.
    (Always using a savepoint would cost three extra round trips per statement on the worker's
    hot path.)
    """
    in_transaction = connections[using or DEFAULT_DB_ALIAS].in_atomic_block
    for attempt in range(ATTEMPTS):
        try:
            if not in_transaction:
                return func()
            with transaction.atomic(using=using):
                return func()
        except OperationalError as exc:
            if not is_serialization_failure(exc) or attempt == ATTEMPTS - 1:
                raise
        time.sleep(random.uniform(0, 0.005 * 2**attempt))
