"""The safety-net scan run by Celery beat: on every shard, recover expired leases, end the PENDING
tasks later than their lateness policy allows, then claim and publish due tasks, batch after batch
while batches come back full."""

import logging
import time

from django.db import DatabaseError

from timeouts.conf import get_settings
from timeouts.dispatch.claiming import MAX_CLAIM, claim_due
from timeouts.dispatch.late_sweep import end_late_until
from timeouts.dispatch.publishing import publish
from timeouts.limiting import controls, shares
from timeouts.storage import shards
from timeouts.store import last_claims, worker_connection
from timeouts.store.recovery import recover_expired

logger = logging.getLogger(__name__)


def scan(*, max_seconds=None) -> int:
    """Returns how many tasks were published. Stops after `max_seconds` (default SCAN_INTERVAL)
    so a long backlog is shared with the next beat-triggered scan instead of piling scans up. A
    shard that fails is logged and left for the next scan: the others are scanned all the same."""
    settings = get_settings()
    deadline = time.monotonic() + (settings.SCAN_INTERVAL if max_seconds is None else max_seconds)
    aliases = shards.aliases()
    if len(aliases) == 1:
        with worker_connection.shared(aliases[0]):
            return _scan_shard(deadline)
    try:
        shares.share_limits()  # before the claims, which read the parts
    except DatabaseError:
        logger.exception("timeouts: sharing the limits among the shards failed; the parts stay as they were")
    published = 0
    for alias in aliases:
        try:
            with worker_connection.shared(alias):
                published += _scan_shard(deadline)
        except DatabaseError:
            logger.exception("timeouts: the scan of shard %r failed; the next scan tries again", alias)
    return published


def _scan_shard(deadline) -> int:
    recover_expired()
    # The handlers' own limits, as the code this process runs declares them (controls.py): in
    # force everywhere within SCAN_INTERVAL of a deploy.
    controls.declare()
    # Before the claims, which would otherwise take tasks that their start then ends (late_sweep.py).
    end_late_until(deadline)
    published = 0
    batch = min(get_settings().SCAN_BATCH_SIZE, MAX_CLAIM)
    while True:
        claims = claim_due(batch)
        published += publish(claims)
        if len(claims) < batch or time.monotonic() > deadline:
            last_claims.note_claim("scan")  # for the health check, once the claims are on their way
            return published
