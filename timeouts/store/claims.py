"""Claims: the statement that takes due tasks (PENDING -> DISPATCHED, with a lease), the one that
ends PENDING tasks later than their lateness policy allows before they are claimed, the one that
gives unpublished claims back, the end of a claim that its publisher ends rather than publishes,
and the claim of one task at a time that timeouts.testing runs in the calling process."""

from django.db import connections

from timeouts.conf import notify_params
from timeouts.states import Status
from timeouts.store import worker_connection
from timeouts.store.queries import execute, fetch_dicts, fetch_one
from timeouts.store.serialization import retry_on_conflict


def claim_rows(params: dict) -> list[dict]:
    """Claim due tasks on the calling thread's own connection (claim_due's parameters: the limit,
    the lead, the shard's position, ...); returns the rows it made DISPATCHED."""
    return fetch_dicts("claim_due", params)


def smallest_late_policy() -> float | None:
    """The smallest max_lateness, in seconds, of the biz_types whose late tasks end (on_late "skip"
    or "dead", not paused) on this thread's connection; None if there are none."""
    return fetch_one("late_policies")["min_lateness"]


def end_late_rows(min_lateness: float, limit: int) -> list[dict]:
    """End up to `limit` PENDING tasks later than their lateness policy allows, on this thread's
    connection (end_late_pending): their job_id, biz_type, on_late and lateness (seconds)."""
    params = {"min_lateness": min_lateness, "limit": limit}
    return retry_on_conflict(lambda: fetch_dicts("end_late_pending", params), using=worker_connection.current().alias)


def release_rows(shard: str, job_ids: list, action_times: list):
    """Give claims whose messages were not published back to PENDING at once, with a NOTIFY, on
    their shard."""
    params = {"job_ids": job_ids, "action_times": action_times, **notify_params()}
    execute("release_claims", params, using=worker_connection.for_shard(shard)).close()


def end_claim(shard: str, job_id: int, action_time, status: Status, error: str) -> bool:
    """End a claim instead of publishing it: a stored Celery call whose `expires` has passed
    (CANCELLED), or whose message cannot be made (DEAD). Fenced by the claim (DISPATCHED), so a claim
    that lease recovery gave back meanwhile is left as it is. Runs on the row's shard, from
    whichever thread publishes it; True if it was still claimed."""
    params = {"job_id": job_id, "action_time": action_time, "status": int(status), "error": error}
    db = worker_connection.for_shard(shard)
    return bool(retry_on_conflict(lambda: fetch_dicts("end_claim", params, using=db), using=shard))


def claim_oldest_due(alias: str, until, since, biz_type: str | None) -> dict | None:
    """Claim the oldest PENDING task of the shard `alias` due by `until`, or, given `since`, scheduled
    since then to be due at once; of `biz_type`, if given (claim_oldest_due). On Django's connection
    to the shard, in the caller's transaction if there is one (timeouts.testing.run_due). The row it
    made DISPATCHED, with its attribute, or None."""
    params = {"until": until, "since": since, "biz_type": biz_type}
    db = connections[alias]
    return retry_on_conflict(lambda: fetch_one("claim_oldest_due", params, using=db), using=alias)
