"""A pool process Celery kills must not leave its worker's main process waiting on a lock forever.

billiard (Celery's process pool) keeps, for each pool process, the count of results the worker's
main process has read from it: an integer in memory shared by the two processes, behind a lock
they share too. A pool process on its way out (Celery's hard time limit sends it SIGTERM, then
SIGKILL 0.1 s later) waits for the main process to read its last result, reading that count under
the lock every 0.1 s. A SIGKILL that lands while it holds the lock leaves the lock taken for good,
and the main process, reading the dead process's last result, waits for it forever in its event
loop: the worker takes nothing more from the broker, and its log says nothing more.

So each pool process reads the count without the lock. Only the main process writes it (under the
lock, which then no other process takes); a read that misses an increment only waits 0.1 s more.
billiard offers no hook for this: celery_internals.py (entry 3) does it, and says what it touches.
"""

from celery.signals import worker_process_init

from timeouts.worker import celery_internals


def install() -> None:
    """Connect the signal sent in each pool process (TimeoutsConfig.ready() calls this)."""
    worker_process_init.connect(in_each_pool_process, dispatch_uid="timeouts.worker.pool_process_exit")


def in_each_pool_process(**kwargs):
    """In a prefork pool process, before it takes any task."""
    celery_internals.read_count_without_lock(celery_internals.pool_process_worker())
