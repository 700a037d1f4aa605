"""Lease recovery: claims and runs whose lease ran out go back to PENDING (or DEAD)."""

import logging

from timeouts import events
from timeouts.conf import notify_params
from timeouts.store import worker_connection
from timeouts.store.queries import fetch_dicts
from timeouts.store.serialization import retry_on_conflict

logger = logging.getLogger(__name__)

BATCH = 1000


def recover_expired() -> int:
    """On the shard of the connection timeouts' statements use in this thread (worker_connection.py)."""
    # A retry in the caller's transaction takes its savepoint on that shard, where the statement runs.
    alias = worker_connection.current().alias
    recovered = 0
    while True:
        rows = retry_on_conflict(lambda: fetch_dicts("recover_expired", {"limit": BATCH, **notify_params()}),
                                 using=alias)
        events.recovered(rows)
        recovered += len(rows)
        if len(rows) < BATCH:
            break
    if recovered:
        logger.warning("timeouts: recovered %d tasks whose lease expired", recovered)
    return recovered
