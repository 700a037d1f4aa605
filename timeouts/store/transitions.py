"""State changes asked for by users: cancel, reschedule, requeue, of one task or by key; and the
cancels of a stored Celery call by its task_id (timeouts.celery.cancel) and of a task of Django's
tasks framework by its result id (timeouts.backends.cancel).

Each is one conditional UPDATE on (job_id, action_time), so it prunes to one partition and row
locking orders it against the worker's compare-and-set: whichever commits first wins, the other
matches nothing. When nothing matched, the row is read again: it may only have moved to another
partition under us (a reschedule, or maintenance moving rows out of DEFAULT), and then the change
is tried again where the row is now.

By key, each is one statement over the key's rows (wherever they are: a row moved under it fails
with 40001, and the statement runs again), on the shard of the key. A biz_type that this
deployment has no tasks of (a typo) raises UnknownBizType rather than change nothing: the task
would run, or not, unlike what the caller meant.
"""

from functools import partial

from django.db import connections, transaction

from timeouts import events, validation
from timeouts.conf import notify_params
from timeouts.registry import check_known
from timeouts.states import CANCELLABLE, REQUEUEABLE, WAITING
from timeouts.storage import shards
from timeouts.store.queries import fetch_dicts, fetch_one
from timeouts.store.scheduling import lock_key
from timeouts.store.serialization import retry_on_conflict

MOVES_FOLLOWED = 3


def _change(task, query, allowed_from, extra=None) -> bool:
    using = task._state.db or "default"
    connection = connections[using]
    for _ in range(MOVES_FOLLOWED):
        params = {"job_id": task.job_id, "action_time": task.action_time, **(extra or {})}
        row = retry_on_conflict(partial(fetch_one, query, params, using=connection), using=using)
        if row is not None:
            task._apply_row(row)
            return True
        current = fetch_one("find_task", {"job_id": task.job_id}, using=connection)
        if current is None:
            return False  # its partition was dropped
        task._apply_row(current)
        if current["status"] not in allowed_from:
            return False
    return False


def cancel(task) -> bool:
    """True only if the handler will never run: the task was PENDING, DISPATCHED (claimed, but its
    worker's compare-and-set had not happened) or DEAD."""
    return events.cancelled_task(task, _change(task, "cancel_task", CANCELLABLE))


def reschedule(task, *, at=None, delay=None) -> bool:
    at, delay = validation.action_time(at, delay)
    return _change(task, "reschedule_task", WAITING, {"at": at, "delay": delay, **notify_params()})


def requeue(task) -> bool:
    return _change(task, "requeue_task", REQUEUEABLE, notify_params())


def _key(biz_type, biz_id, using) -> tuple[dict, str]:
    """The checked key as query parameters, and its shard (`using`, when the caller chose it)."""
    key = {"biz_type": check_known(biz_type), "biz_id": validation.biz_id(biz_id)}
    return key, using or shards.alias_of_key(key["biz_type"], key["biz_id"])


def cancel_by_key(biz_type, biz_id, *, using=None) -> tuple[int, bool]:
    """Cancel every task of (biz_type, biz_id) that has not started, and discard its DEAD ones;
    returns how many ended, and whether one of them had not started (its handler will not run)."""
    key, using = _key(biz_type, biz_id, using)
    connection = connections[using]
    params = {**key, "statuses": list(CANCELLABLE)}
    rows = retry_on_conflict(lambda: fetch_dicts("cancel_by_key", params, using=connection), using=using)
    events.cancelled(key["biz_type"], len(rows), using)
    return len(rows), any(row["was_waiting"] for row in rows)


def reschedule_by_key(biz_type, biz_id, *, at=None, delay=None, using=None) -> bool:
    """Move every task of (biz_type, biz_id) that has not started to the new time; True if one moved."""
    key, using = _key(biz_type, biz_id, using)
    at, delay = validation.action_time(at, delay)
    connection = connections[using]
    params = {**key, "at": at, "delay": delay, **notify_params()}
    rows = retry_on_conflict(lambda: fetch_dicts("reschedule_by_key", params, using=connection), using=using)
    return bool(rows)


def requeue_by_key(biz_type, biz_id, *, using=None) -> bool:
    """Make the latest task of (biz_type, biz_id) PENDING again, due now, if it is DEAD or CANCELLED
    and no other task of the key waits to run; True if it did. Under the key's advisory lock, as
    schedule() with on_conflict takes it: the key keeps at most one waiting task."""
    key, using = _key(biz_type, biz_id, using)
    connection = connections[using]

    def requeue_latest():
        # savepoint=False: inside the caller's transaction, retry_on_conflict() has opened the savepoint.
        with transaction.atomic(using=using, savepoint=False):
            lock_key(key, connection)
            return fetch_one("requeue_latest_of_key", {**key, **notify_params()}, using=connection)

    return retry_on_conflict(requeue_latest, using=using) is not None


def cancel_call(task_id: str, prefix: str, using: str) -> bool:
    """Every waiting call of the Celery `task_id` (checked) on its shard `using`; True means none
    of them will ever start."""
    connection = connections[using]
    params = {"task_id": task_id, "prefix": prefix}
    rows = retry_on_conflict(lambda: fetch_dicts("cancel_call", params, using=connection), using=using)
    for row in rows:
        events.cancelled(row["biz_type"], 1, using)
    return bool(rows)


def cancel_backend_task(key: dict, prefix: str, using: str) -> bool:
    """The task of Django's tasks framework at `key` (its job_id and action_time) on its shard
    `using`, if it has not started: True means it never runs. A requeued row has moved (its
    action_time changed): it is followed where it is now."""
    connection = connections[using]
    for _ in range(MOVES_FOLLOWED):
        params = {**key, "prefix": prefix}
        row = retry_on_conflict(lambda params=params: fetch_one("tasks_backend_cancel", params, using=connection),
                                using=using)
        if row is not None:
            events.cancelled(row["biz_type"], 1, using)
            return True
        # The compare-and-set or another cancel won; or the row moved to another partition.
        current = fetch_one("tasks_backend_result_moved", {"job_id": key["job_id"], "prefix": prefix},
                            using=connection)
        if current is None or current["status"] not in WAITING or current["action_time"] == key["action_time"]:
            return False
        key = {"job_id": current["job_id"], "action_time": current["action_time"]}
    return False
