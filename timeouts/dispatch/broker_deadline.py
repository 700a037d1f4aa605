"""Publishing with a deadline, for the dispatcher: a broker that stops answering must not stop it.

`publish()` bounds its retries when the broker refuses connections, but a broker that accepted the
connection and then went silent blocks a send forever (kombu's Redis transport has no socket
timeout by default). So each chunk of messages is sent from a thread of its own, and the
dispatcher waits for it at most `timeout` seconds. The scan, run by Celery beat, keeps calling
`publish()` directly: its worker is already bounded by Celery's task time limits.
"""

import logging
import threading

from celery import current_app
from django.db import connections

from timeouts.dispatch.claiming import release
from timeouts.dispatch.publishing import publish

logger = logging.getLogger("timeouts.dispatcher")

CHUNK = 100  # messages per bounded send: a timeout re-queues at most this many


class PublishFailed(Exception):
    """The broker refused messages or did not take them in time; their claims were released."""


def publish_bounded(claims, timeout) -> int:
    """Publish `claims` chunk by chunk, each within `timeout` seconds; on failure release every
    claim not published and raise PublishFailed."""
    sent = 0
    for start in range(0, len(claims), CHUNK):
        try:
            sent += publish_within(claims[start:start + CHUNK], timeout)
        except PublishFailed:
            release(claims[start + CHUNK:])  # never handed to the broker
            raise
    return sent


def publish_within(claims, timeout) -> int:
    """`publish(claims)`, waiting for it at most `timeout` seconds.

    If it does not finish in time, its claims are released here. A message that still gets through
    later is harmless: only one message per attempt passes the worker's compare-and-set. (On an
    error, `publish()` itself releases what it did not send.)
    """
    if not claims:
        return 0
    outcome = {}
    done = threading.Event()

    def send():
        try:
            outcome["sent"] = publish(claims)
        except Exception as exc:
            outcome["error"] = exc
        finally:
            # The Django connections this thread opened, if any: a claim's statements (a release,
            # an expired call's end) go to its shard on one of them (own_connection.for_shard).
            connections.close_all()
            done.set()

    threading.Thread(target=send, name="timeouts-publish", daemon=True).start()
    if not done.wait(timeout):
        release(claims)
        raise PublishFailed(f"the broker did not take {len(claims)} messages within {timeout} s")
    if "error" in outcome:
        raise PublishFailed(f"publishing failed: {outcome['error']!r}") from outcome["error"]
    return outcome["sent"]


def warm_up_broker():
    """Open a broker connection in the background, so the first due task does not wait for it.
    Failing is fine: publishing connects (and reports errors) by itself."""
    def connect():
        try:
            with current_app.producer_or_acquire() as producer:
                producer.connection.ensure_connection(max_retries=1)
        except Exception as exc:
            logger.warning("timeouts.dispatcher: cannot reach the broker yet (%r)", exc)

    threading.Thread(target=connect, name="timeouts-broker-warm-up", daemon=True).start()
