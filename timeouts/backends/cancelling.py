"""cancel(result_id): the fenced cancel of a task that has not started."""

from django.db import connections

from timeouts import events
from timeouts.backends import results
from timeouts.backends.queues import PREFIX
from timeouts.states import WAITING
from timeouts.storage import shards
from timeouts.store.queries import fetch_one
from timeouts.store.serialization import retry_on_conflict

# A requeued row moves (its action_time changes); it is followed this many times.
MOVES_FOLLOWED = 3


def cancel(result_id) -> bool:
    """Cancel the task of `result_id` (a TaskResult or its id) if it has not started: True means it
    never runs, and its result reads FAILED (errors end with `timeouts.backends.Cancelled`). False:
    it has started (or ended), or there is no such task. Inside `transaction.atomic()` the cancel
    is part of that transaction. What is no result id of this backend at all raises
    TaskResultDoesNotExist."""
    result_id = getattr(result_id, "id", result_id)
    key = results.parse_result_id(result_id)
    alias = shards.alias_of_job(key["job_id"])
    connection = connections[alias]
    for _ in range(MOVES_FOLLOWED):
        params = {**key, "prefix": PREFIX}
        row = retry_on_conflict(lambda params=params: fetch_one("tasks_backend_cancel", params, using=connection))
        if row is not None:
            events.cancelled(row["biz_type"], 1, alias)
            return True
        # The compare-and-set or another cancel won; or the row moved to another partition.
        current = fetch_one("tasks_backend_result_moved", {"job_id": key["job_id"], "prefix": PREFIX},
                            using=connection)
        if current is None or current["status"] not in WAITING or current["action_time"] == key["action_time"]:
            return False
        key = {"job_id": current["job_id"], "action_time": current["action_time"]}
    return False
