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
its next attempt however late. @timeouts.handler and set_limits() check the options with the
limits' own checks (validation.check_lateness_policy).
"""

from timeouts.states import Status

# The first words of the last_error that a late start writes (sql/queries/attempts.sql writes
# them, test_late_starts checks that they agree).
NOT_RUN = "not run: started "


def ended_late(status, last_error) -> bool:
    """Whether a late start ended a task of this status and last_error (CANCELLED or DEAD)."""
    return status in (Status.CANCELLED, Status.DEAD) and bool(last_error) and last_error.startswith(NOT_RUN)

