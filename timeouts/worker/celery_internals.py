"""Where timeouts' worker goes beyond the public hooks of Celery and billiard, and why.

timeouts installs itself through public hooks: signals (`worker_init`, `worker_process_init`,
`task_received`, `worker_ready`, `worker_shutdown`), bootsteps added to `app.steps`, a Request class
(`Task.Request`) and settings (reconnect_prefetch.py works around a Celery behaviour with one).
What is left has no public hook, and is listed below: what each entry touches, why no public hook
does it. tests/unit/worker/test_celery_internals.py fails, naming the entry, on a Celery or billiard whose
attributes or code no longer match. Checked against Celery 5.7.0, kombu 5.7.0 and billiard 4.3.2.

1. `take_requests()`: which callable a prefork worker hands its requests to (on-time work first,
   priority.py). Celery's Pool step sets `WorkController.process_task` to `_process_task_sem`
   (wait for a free process on `worker.semaphore`, then `_process_task`), and the Consumer step,
   always the last one, passes `w.process_task` to the consumer as its `on_task_request`. A worker
   bootstep that requires Pool replaces `process_task` in between. No public hook orders the
   requests waiting for a process: a Request class is reached only once a process is free, the
   task_received signal cannot hold a request back, and kombu's semaphore queues its waiters first
   come, first served with no way to put one first.

2. `hand_to_pool()`: what `WorkController._process_task` does with a request once a process is free
   (execute it on the pool; give the process back if the request was revoked meanwhile), written
   with public calls so that nothing private is called. The test compares it with Celery's.

3. `read_count_without_lock()`: the count of results a billiard pool process reads, on its way out,
   under a lock it shares with the worker's main process (`Worker.on_ready_counter`, read by
   `Worker._ensure_messages_consumed`), found through the process's `_target` (billiard's Process
   keeps the Worker it runs there). A process killed holding that lock leaves the main process
   waiting for it forever (pool_process_exit.py). billiard takes neither the count nor the lock as
   a parameter, and `worker_process_init` is sent without the pool process's Worker.

4. `terminate_handler_fired()`: whether billiard's SIGTERM handler, which sets a flag and then
   raises SystemExit wherever the pool process was, has run in this process (running.py: the
   worker, not the attempt, stopped it). Public in billiard 4.3 (`billiard.common.
   terminate_handler_fired`); older ones that Celery 5.5 allows keep only the flag,
   `billiard.common._should_have_exited`.

5. The Request class of `DurableTask` (durable/starts.py, `StartingRequest`) is a public hook, but
   the worker runs each task's requests through a subclass it makes of it
   (celery.worker.request.create_request_cls), whose own `execute_using_pool` does not call the
   base class's. StartingRequest wraps that method in `__init_subclass__`; the test fails when
   Celery's subclass no longer has one of its own, or when the wrapping no longer happens. The
   subclass keeps StartingRequest's `on_accepted` (it lets a start's lease go): the test fails when
   it has one of its own.

6. The Strategy of `timeouts.calls` (durable/unpacking.py) is a public hook (`Task.Strategy`), but
   what it does for each call it unpacks is Celery's default strategy's, which is not public: it
   reads the consumer's `timer`, `qos`, `task_buckets`, `_limit_task`, `on_task_request`,
   `on_invalid_task`, `on_unknown_task`, `controller.state.revoked`, `event_dispatcher` and
   `disable_rate_limits`, and calls `celery.worker.state.task_reserved`/`task_scheduled` and
   `celery.worker.request.create_request_cls` as celery.worker.strategy.default does. No public
   hook turns one message into several requests. The test fails when Celery's default strategy no
   longer reads one of these.
"""

from billiard import common as billiard_common
from billiard import process as billiard_process
from celery.exceptions import TaskRevokedError

CHECKED = {"celery": "5.7.0", "kombu": "5.7.0", "billiard": "4.3.2"}


# --- 1. Where a prefork worker hands its requests ----------------------------------------------------

def takes_requests_through_semaphore(worker) -> bool:
    """Whether Celery's Pool step made `worker` wait for a free process on its semaphore before each
    request (components.Pool.create): an event loop (prefork), with put locks. Other pools (threads,
    solo, gevent) queue nothing in the worker."""
    return worker.semaphore is not None and bool(worker.pool_putlocks) and worker.pool_cls.uses_semaphore


def take_requests(worker, process_task) -> bool:
    """From a worker bootstep that runs after Celery's Pool step (and before its Consumer step, which
    runs last): hand the worker's requests to `process_task(request)`, instead of Celery's
    `_process_task_sem`, where the worker makes them wait on its semaphore. False, and nothing
    changed, elsewhere."""
    if not takes_requests_through_semaphore(worker):
        return False
    worker.process_task = process_task
    return True


# --- 2. A request to the pool, once a process is free --------------------------------------------------

def hand_to_pool(worker, request) -> None:
    """What WorkController._process_task does: run `request` on the pool, and give back the process it
    took if the request was revoked meanwhile."""
    try:
        request.execute_using_pool(worker.pool)
    except TaskRevokedError:
        worker.semaphore.release()


# --- 3. A billiard pool process's count of results read ------------------------------------------------

def pool_process_worker():
    """The billiard pool Worker this process runs (None outside a billiard pool process)."""
    return getattr(billiard_process.current_process(), "_target", None)


def read_count_without_lock(worker) -> None:
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


# --- 4. billiard's SIGTERM handler ---------------------------------------------------------------

terminate_handler_fired = getattr(billiard_common, "terminate_handler_fired",
                                  lambda: billiard_common._should_have_exited[0])
