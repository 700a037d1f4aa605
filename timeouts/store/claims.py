"""A claim that its publisher ends rather than publishes: a stored Celery call whose `expires` has
passed (CANCELLED), or whose message cannot be made (DEAD). Fenced by the claim (DISPATCHED), so a
claim that lease recovery gave back meanwhile is left as it is."""

from timeouts.states import Status
from timeouts.store import worker_connection
from timeouts.store.queries import fetch_dicts
from timeouts.store.serialization import retry_on_conflict


def end_claim(shard: str, job_id: int, action_time, status: Status, error: str) -> bool:
    """End the claimed row on its shard, from whichever thread publishes it; True if it was still
    claimed."""
    params = {"job_id": job_id, "action_time": action_time, "status": int(status), "error": error}
    db = worker_connection.for_shard(shard)
    return bool(retry_on_conflict(lambda: fetch_dicts("end_claim", params, using=db), using=shard))
