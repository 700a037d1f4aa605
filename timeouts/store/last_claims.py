"""The record that claimers are at work: each kind of claimer (the dispatchers, the scan) notes
in timeouts_last_claims when it last claimed on a shard, for the health check
(timeouts.stats.health).

A dispatcher can claim hundreds of times a second, so the note is written at most once a second
per process, shard and kind, and costs the other rounds a clock read. A claimer writes it once a
round's claims are published, so it never delays a message; an error writing it is logged, and the
claimer goes on: the record of the claims never stops them.
"""

import logging
import os
import socket
import threading
import time

from django.db import DatabaseError

from timeouts.store import worker_connection
from timeouts.store.queries import execute

logger = logging.getLogger(__name__)

CLAIMERS = ("dispatcher", "scan")  # the CHECK constraint of timeouts_last_claims allows these
EVERY = 1.0  # seconds: the most often one process notes one kind of claim on one shard

_noted: dict[tuple[int, str, str], float] = {}  # (pid, alias, claimer) -> monotonic time of the last note
_lock = threading.Lock()


def note_claim(claimer: str) -> None:
    """Note that `claimer` ("dispatcher" or "scan") just claimed on the shard of the calling thread's
    connection for timeouts' statements, unless this process noted it less than EVERY seconds ago."""
    if claimer not in CLAIMERS:
        raise ValueError(f"claimer must be one of {', '.join(CLAIMERS)}, got {claimer!r}")
    db = worker_connection.current()
    key, now = (os.getpid(), db.alias, claimer), time.monotonic()
    with _lock:  # the dispatchers of several shards run in threads of one process
        if now - _noted.get(key, float("-inf")) < EVERY:
            return
        _noted[key] = now
    try:
        execute("note_claim", {"claimer": claimer, "process": _process()}, using=db).close()
    except DatabaseError as exc:
        logger.warning("timeouts: could not note the %s's claim on %r for the health check (%s)", claimer,
                       db.alias, exc)


def _process() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"[:255]
