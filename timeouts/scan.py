"""The safety-net scan run by Celery beat: recover expired leases, then claim and publish due
tasks, batch after batch while batches come back full."""

import time

from . import isolation
from .claiming import MAX_CLAIM, claim_due
from .conf import get_settings
from .publishing import publish
from .recovery import recover_expired


def scan(*, max_seconds=None) -> int:
    """Returns how many tasks were published. Stops after `max_seconds` (default SCAN_INTERVAL)
    so a long backlog is shared with the next beat-triggered scan instead of piling scans up."""
    settings = get_settings()
    deadline = time.monotonic() + (settings.SCAN_INTERVAL if max_seconds is None else max_seconds)
    recover_expired()
    # The handlers' own limits, as the code this process runs declares them (isolation.py): in
    # force everywhere within SCAN_INTERVAL of a deploy.
    isolation.declare()
    published = 0
    batch = min(settings.SCAN_BATCH_SIZE, MAX_CLAIM)
    while True:
        claims = claim_due(batch)
        published += publish(claims)
        if len(claims) < batch or time.monotonic() > deadline:
            return published
