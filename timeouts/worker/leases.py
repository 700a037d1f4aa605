"""Leases a worker keeps alive while their work goes on, from a thread of its own.

A started task holds its row for a lease: when the lease runs out, lease recovery takes the task
for lost and it runs again. Some work outlives the lease it started with, and must not be taken
for lost while its process lives:

- a `DurableTask` call, whose lease is its hard time limit or its `ttr` (durable/attempt.py);
- a call the worker's main process started ahead of its eta, while it waits for a pool process
  (durable/starts.py);
- a handler in a pool that cannot stop it at its hard time limit (threads, solo, gevent, eventlet:
  `pool_stops_handlers()`). Prefork kills a pool process at its task's hard time limit, which is
  the TTR of a `timeouts.run` message: there the lease is the TTR, and a slow handler is stopped
  before lease recovery dispatches its task again.

`heartbeat.add()` takes such a lease; the heartbeat then extends it (extend_leases: still RUNNING
for that attempt) every third of the shortest lease it keeps, until `heartbeat.remove()`. A
process that dies stops extending: its leases run out within one lease, and their tasks run again.
"""

import logging
import os
import threading
import time

from celery.signals import worker_init, worker_process_init

logger = logging.getLogger(__name__)


class Lease:
    """One task's lease, kept by the heartbeat from add() to remove(). `keep`, if given, is asked
    before each extension: once it returns False, the lease is no longer extended."""

    __slots__ = ("shard", "job_id", "action_time", "attempt", "ttr", "keep")

    def __init__(self, shard, job_id, action_time, attempt, ttr, keep=None):
        self.shard, self.job_id, self.action_time, self.attempt, self.ttr = shard, job_id, action_time, attempt, ttr
        self.keep = keep

    def kept(self) -> bool:
        keep = self.keep
        try:
            return keep is None or keep()
        except Exception:  # not extended any more: it runs out, and its task runs again
            logger.exception("timeouts: could not tell whether to keep the lease of job %s", self.job_id)
            return False


class Heartbeat:
    """Extends the leases added in this process, every third of the shortest, from a thread with its
    own connection, in one statement per shard."""

    MIN_INTERVAL = 0.2  # seconds

    def __init__(self):
        self._reset()
        # A forked pool process starts with none of its parent's leases, and no thread yet.
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self):
        self.lock = threading.Lock()
        self.leases = set()
        self.wake = threading.Event()
        self.due = None  # monotonic time of the next extension, None while there is nothing to extend
        self.thread = None

    def add(self, shard, key, attempt, ttr, keep=None) -> Lease:
        """Keep the lease of the task `key` ({job_id, action_time}) started as `attempt`."""
        lease = Lease(shard, key["job_id"], key["action_time"], attempt, ttr, keep)
        with self.lock:
            self.leases.add(lease)
            if self.thread is None:
                self.thread = threading.Thread(target=self._beat, name="timeouts-leases", daemon=True)
                self.thread.start()
            # Woken only if this lease is due before the next extension: not for every task.
            sooner = self.due is None or time.monotonic() + self._interval(ttr) < self.due
        if sooner:
            self.wake.set()
        return lease

    def remove(self, lease):
        if lease is not None:
            with self.lock:
                self.leases.discard(lease)

    def _interval(self, ttr) -> float:
        return max(self.MIN_INTERVAL, ttr / 3)

    def _beat(self):
        while True:
            self.wake.clear()  # before reading: a lease added meanwhile wakes the wait below
            with self.lock:
                if not self.leases:
                    self.due = None
                else:
                    soonest = time.monotonic() + self._interval(min(lease.ttr for lease in self.leases))
                    self.due = soonest if self.due is None else min(self.due, soonest)
                due = self.due
            if self.wake.wait(None if due is None else max(0.0, due - time.monotonic())):
                continue  # a lease was added: it may be shorter
            with self.lock:
                self.due = None
                leases = list(self.leases)
            gone = {lease for lease in leases if not lease.kept()}
            if gone:
                with self.lock:
                    self.leases.difference_update(gone)
            self._extend([lease for lease in leases if lease not in gone])

    @staticmethod
    def _extend(leases):
        from timeouts.store import attempts, worker_connection

        started = {(lease.shard, lease.job_id, lease.action_time, lease.attempt) for lease in leases}
        for shard, params in attempts.params_by_shard(started).items():
            try:
                with worker_connection.used(shard):
                    attempts.extend_leases(params)
            except Exception:
                logger.exception("timeouts: could not extend the leases of %d started tasks", len(params["job_ids"]))
                worker_connection.close()


heartbeat = Heartbeat()


# --- Which pools stop a handler at its hard time limit ---------------------------------------------

_worker_pid = None  # the process of a Celery worker's main process, in it and in what it forks
_in_pool_process = False  # this process is a prefork pool process


def install() -> None:
    """Connect the signals that tell a worker's processes apart (TimeoutsConfig.ready() calls this)."""
    worker_init.connect(_in_a_worker, dispatch_uid="timeouts.worker.leases.worker")
    worker_process_init.connect(_in_a_pool_process, dispatch_uid="timeouts.worker.leases.pool_process")


def _in_a_worker(sender=None, **kwargs):
    global _worker_pid
    _worker_pid = os.getpid()


def _in_a_pool_process(sender=None, **kwargs):
    """Sent in each prefork pool process, which the worker's main process kills when its task
    outlives its hard time limit (billiard's time-out handler); and by the solo pool, in the worker's
    main process itself, which nothing stops."""
    global _in_pool_process
    _in_pool_process = os.getpid() != _worker_pid


def pool_stops_handlers() -> bool:
    """Whether the lease of a handler that runs in this process is left to the hard time limit: in a
    prefork pool process, which is killed at the limit; and outside any worker, where an eager task
    runs inside its caller, maybe inside the caller's transaction, which a heartbeat's statement
    would wait for. The threads and solo pools ignore time limits; gevent raises its time-out in a
    handler only when the handler yields to gevent, and eventlet not at all."""
    return _in_pool_process or _worker_pid is None
