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

Checked against billiard 4.3.2 (Celery 5.7.0). tests/unit/test_pool_process_exit.py fails on
another billiard: check there that pool processes still wait under that lock, then add the version.
"""

from billiard import process
from celery.signals import worker_process_init


@worker_process_init.connect(dispatch_uid="timeouts.worker.pool_process_exit")
def _in_each_pool_process(**kwargs):
    """In a prefork pool process, before it takes any task: its billiard Worker is its target."""
    read_count_without_lock(getattr(process.current_process(), "_target", None))


def read_count_without_lock(worker):
    """Give a billiard pool Worker a view of its count that reads it without the lock."""
    count = getattr(worker, "on_ready_counter", None)
    if count is not None and hasattr(count, "get_obj"):  # a billiard synchronized Value
        worker.on_ready_counter = _UnlockedCount(count.get_obj())


class _UnlockedCount:
    """The count's value, read straight from the shared memory."""

    def __init__(self, shared):
        self._shared = shared

    @property
    def value(self) -> int:
        return self._shared.value
