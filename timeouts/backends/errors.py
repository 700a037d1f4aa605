"""What TimeoutsBackend raises for bad input (each is both a `timeouts.TimeoutsError` and Django's
`InvalidTask`: nothing was stored), and the exceptions its results name for attempts that ended
without one of their own."""

from timeouts.backends.compat import InvalidTask
from timeouts.errors import InvalidAttribute, InvalidOption


class InvalidTaskArguments(InvalidAttribute, InvalidTask):
    """A task's arguments are JSON (lists, objects with string keys, strings without NUL, finite
    numbers, booleans, null), together at most TIMEOUTS["MAX_ATTRIBUTE_BYTES"] bytes."""


class InvalidTaskOptions(InvalidOption, InvalidTask):
    """The task cannot run on this backend as it is (its queue, priority, run_after or function)."""


class LeaseExpired(Exception):  # noqa: N818  (named as the result shows it: what happened)
    """An attempt whose worker stopped answering: the worker process was lost (killed, out of
    memory, its machine gone), or the task ran longer than the backend's TTR and Celery killed it."""


class Cancelled(Exception):  # noqa: N818
    """The task was cancelled (timeouts.backends.cancel, or an operator) before it started, or an
    operator discarded it after every attempt failed."""


class StartedLate(Exception):  # noqa: N818
    """The task's start came later than the lateness policy of its queue's biz_type allows
    (timeouts.set_limits(..., max_lateness=, on_late=)): it ended instead of running. Its traceback
    says how late it was."""
