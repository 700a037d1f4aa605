"""Handing claimed tasks to Celery: one `timeouts.run` message per task, JSON, on the handler's queue.

Only due tasks are published, or tasks due within the dispatcher's short DISPATCH_LEAD: those carry
a Celery ETA equal to their run_at, so a worker holds them for milliseconds at most. Nothing waits
in a worker's memory or in the broker long enough for a visibility timeout to matter, and the
worker's compare-and-set still refuses to start a task early by the database clock.
"""

import logging

from .claiming import release
from .registry import find_handler

logger = logging.getLogger(__name__)

# Bounded: a scan must not hang on a broker that is down; unpublished claims are released instead.
RETRY_POLICY = {"max_retries": 2, "interval_start": 0.1, "interval_step": 0.2, "interval_max": 0.5}


def publish(claims) -> int:
    """Publish a message per claim; on a broker error, release what was not sent and re-raise."""
    from .tasks import run  # the Celery task; imported late so Django settings load first

    sent = 0
    try:
        with run.app.producer_or_acquire() as producer:
            for claim in claims:
                handler = find_handler(claim.biz_type)  # unknown here: the default queue
                options = {"producer": producer, "retry_policy": RETRY_POLICY}
                if handler is not None and handler.queue:
                    options["queue"] = handler.queue
                # Celery kills a handler that outlives its lease, so it cannot run on beside the
                # re-dispatched attempt that lease recovery will start.
                options["time_limit"] = claim.ttr
                if claim.eta is not None:
                    options["eta"] = claim.eta
                run.apply_async(args=claim.message_args(), **options)
                sent += 1
    except Exception:
        # The failing message may or may not have reached the broker: releasing it is still safe,
        # because only one message per attempt can pass the worker's compare-and-set.
        logger.exception("timeouts: publishing failed; releasing %d unpublished claims", len(claims) - sent)
        release(claims[sent:])
        raise
    return sent
