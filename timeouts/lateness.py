"""The lateness policy of a biz_type: how late an attempt may start (`max_lateness`), and what
becomes of one that starts later (`on_late`): "run" it all the same, "skip" it (the task ends
CANCELLED) or make it "dead" (the task ends DEAD, for an operator to requeue).

An attempt's lateness is how long after the time it was due its start comes: after its
action_time for a first attempt, after the end of its backoff (run_at) for a retry, so that a
handler's own retries are not taken for the deployment being late. The worker's compare-and-set
decides, by the database clock, in the statement that starts the attempt (start_or_end_late in
sql/queries/attempts.sql), with the policy in force in timeouts_limits: a handler's own
(`@timeouts.handler(max_lateness=, on_late=)`, stored as its limits are) or set_limits()'.

A start that a policy ended writes last_error beginning with NOT_RUN; that is how the admin finds
such tasks, and how the start knows that a task was requeued after it: an operator's requeue runs
its next attempt however late.
"""

from datetime import timedelta

from timeouts.states import Status
from timeouts.validation import describe

ON_LATE = ("run", "skip", "dead")
# The first words of the last_error that a late start writes (sql/queries/attempts.sql writes
# them, test_lateness checks that they agree).
NOT_RUN = "not run: started "


def check_policy(max_lateness, on_late, error) -> tuple[timedelta | None, str]:
    """(max_lateness, on_late) as given, or `error(message)` naming what is wrong with them."""
    if max_lateness is not None and (not isinstance(max_lateness, timedelta) or max_lateness <= timedelta(0)):
        raise error(f"max_lateness must be a positive timedelta or None (no limit), got {_shown(max_lateness)}")
    if not isinstance(on_late, str) or on_late not in ON_LATE:
        raise error(f"on_late must be 'run', 'skip' or 'dead', got {describe(on_late)}")
    if on_late != "run" and max_lateness is None:
        raise error(f"on_late={on_late!r} needs a max_lateness: how late a start may come before the task "
                    f"is {'skipped' if on_late == 'skip' else 'made dead'} instead")
    return max_lateness, on_late


def ended_late(status, last_error) -> bool:
    """Whether a late start ended a task of this status and last_error (CANCELLED or DEAD)."""
    return status in (Status.CANCELLED, Status.DEAD) and bool(last_error) and last_error.startswith(NOT_RUN)


def _shown(value) -> str:
    return repr(value) if isinstance(value, timedelta) else describe(value)
