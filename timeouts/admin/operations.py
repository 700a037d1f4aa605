"""Operator moves built on the ORM API (used by the admin's actions)."""

from datetime import timedelta

from timeouts.states import Status
from timeouts.store.clock import database_now


def run_now(task, *, now=None) -> str:
    """Make a PENDING task due now (the database clock), as `task.reschedule(delay=0)` does.

    Returns what happened: "moved" (it is due now), "already due" (it was: nothing changed, so its
    action_time and lateness stay true), or "too late" (it is no longer PENDING: nothing changed).
    """
    if task.status != Status.PENDING:
        return "too late"
    if task.run_at <= (now or database_now(task._state.db or "default")):
        return "already due"
    if not task.reschedule(delay=timedelta(0)):
        return "too late"
    return "moved"
