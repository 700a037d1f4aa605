"""The dispatcher as a thread of a Celery worker, when TIMEOUTS["DISPATCHER_IN_WORKER"] is True.

A small deployment then needs no extra process. The thread lives in the worker's main process only:
`worker_ready` and `worker_shutdown` are sent there, after the prefork pool has forked its children,
so no pool process gets a copy. Any number of workers may run one each (SKIP LOCKED).

`connect()` connects the signals (`TimeoutsConfig.ready()` calls it); they do nothing unless the
setting is on.
"""

import logging
import threading

from celery.signals import worker_ready, worker_shutdown

logger = logging.getLogger("timeouts.dispatcher")

JOIN_TIMEOUT = 15.0  # seconds: a publish in flight is bounded by the dispatcher's publish timeout

_running = None  # (thread, its stop event) in the worker's main process


def connect() -> None:
    worker_ready.connect(start, dispatch_uid="timeouts.dispatch.in_worker.start")
    worker_shutdown.connect(stop, dispatch_uid="timeouts.dispatch.in_worker.stop")


def start(sender=None, **kwargs):
    global _running
    from timeouts.conf import get_settings  # late: this module is imported while Django is starting

    if not get_settings().DISPATCHER_IN_WORKER or _running is not None:
        return
    from timeouts.dispatch.dispatcher import run_on_every_shard

    stopping = threading.Event()
    thread = threading.Thread(target=run_on_every_shard, args=(stopping,), name="timeouts-dispatcher", daemon=True)
    _running = (thread, stopping)
    thread.start()
    logger.info("timeouts.dispatcher: running inside the worker")


def stop(sender=None, **kwargs):
    global _running
    if _running is None:
        return
    thread, stopping = _running
    _running = None
    stopping.set()
    thread.join(JOIN_TIMEOUT)
    if thread.is_alive():
        logger.error("timeouts.dispatcher: did not stop within %s s", JOIN_TIMEOUT)
