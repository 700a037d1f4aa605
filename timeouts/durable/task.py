"""`DurableTask`: a Celery Task base class whose eta/countdown calls wait in `timeouts_task`
instead of a broker or a worker's memory (importable as `timeouts.celery.DurableTask`).

    app = Celery("proj", task_cls="timeouts.celery:DurableTask")   # every task of the app
    @app.task(base=DurableTask)                                    # or one task

- `apply_async` (and `delay`, signatures, `retry`) with an `eta` or `countdown` that is not yet due,
  by the caller's clock as Celery reckons it: the call becomes a row (durable/calls.py) in the
  caller's transaction, and the usual AsyncResult comes back. Anything else, and Celery's own
  `celery.*` tasks (chord_unlock polls with a countdown): Celery's apply_async, unchanged.
- At its time the row is claimed and the task's own message published, with the row's fence. The
  worker starts the task only if the message still owns the row's current attempt (the
  compare-and-set of `timeouts.run`, which the worker's main process runs while a message claimed
  ahead waits for its eta: durable/starts.py): a message published twice runs once, and a cancel
  that returned True wins. The row then records the outcome: DONE when the task returned, raised
  Retry (the retry is a call of its own, with the same task_id) or Ignore; DEAD with the reason
  when it raised Reject or anything else, or Celery killed it at its hard time limit (Celery
  records the FAILURE as usual; an operator may requeue the row). While the call runs, a thread
  of the worker process extends its lease (the call's hard time limit, else the task's `ttr`,
  else DEFAULT_TTR) every third of it (leases.py); a worker lost mid-run stops extending it, the
  lease runs out, and the call runs again. A call started ahead that waits for a pool process has
  its lease kept by the worker's main process meanwhile, and its body runs only once the database
  confirms that its start still holds.
"""

import logging
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from celery import Task
from celery.exceptions import TimeLimitExceeded
from celery.utils.time import maybe_make_aware
from dateutil.parser import isoparse

from timeouts import registry
from timeouts.durable import calls as celery_calls
from timeouts.protocol import FENCE_HEADER, from_header
from timeouts.storage import shards

if TYPE_CHECKING:
    from celery import Celery
    from celery.result import AsyncResult

__all__ = ["DurableTask"]

logger = logging.getLogger(__name__)

# Celery's own tasks (celery.chord_unlock, celery.backend_cleanup, ...) keep Celery's ways.
CELERY_INTERNAL = "celery."
# timeouts' own tasks (timeouts.run, ...), DurableTask too under task_cls, are never called with an ETA.
TIMEOUTS_OWN = "timeouts."


class DurableTask(Task):
    """A Celery task whose not-yet-due eta/countdown calls are stored durably by timeouts."""

    #: The worker starts a call received ahead of its eta while the message waits (durable/starts.py).
    Request = celery_calls.REQUEST_CLASS

    #: Seconds after which a started call whose worker stopped extending its lease (the worker
    #: died) counts as lost, and runs again. None: the call's hard time limit, if it has one,
    #: else TIMEOUTS["DEFAULT_TTR"].
    ttr: int | None = None

    @classmethod
    def on_bound(cls, app: "Celery") -> None:
        """Celery binds each task class to its app: the admin then offers its calls' biz_type."""
        super().on_bound(app)
        if cls.name and not cls.name.startswith((CELERY_INTERNAL, TIMEOUTS_OWN)):
            registry.note_of_kind(celery_calls.biz_type_for(cls.name))

    def apply_async(self, args: Sequence[Any] | None = None, kwargs: dict[str, Any] | None = None,
                    task_id: str | None = None, producer: Any = None, link: Any = None, link_error: Any = None,
                    shadow: str | None = None, **options: Any) -> "AsyncResult":
        """Celery's apply_async(); with an `eta` or `countdown` not yet due, the call is stored in
        timeouts' table (in the caller's transaction, if any) and published when it is due."""
        headers = options.get("headers")
        if headers and FENCE_HEADER in headers:
            # A retry copies the request's headers: the fence belongs to the message that ran.
            options["headers"] = {key: value for key, value in headers.items() if key != FENCE_HEADER}
        app = self._get_app()
        eta = None
        if not app.conf.task_always_eager and not self.name.startswith(CELERY_INTERNAL):
            eta = _not_yet_due(app, options.get("eta"), options.get("countdown"))
        if eta is None:
            return super().apply_async(args, kwargs, task_id, producer, link, link_error, shadow, **options)
        return self._store(app, args, kwargs, task_id, link, link_error, shadow, eta, options)

    def _store(self, app, args, kwargs, task_id, link, link_error, shadow, eta, options):
        """What Task.apply_async does before it calls send_task, then the row instead of a message."""
        if self.soft_time_limit and self.time_limit and self.soft_time_limit > self.time_limit:
            raise ValueError("soft_time_limit must be less than or equal to time_limit")
        if self.typing:
            check_arguments = getattr(self, "__header__", None)
            if check_arguments is not None:
                check_arguments(*(args or ()), **(kwargs or {}))
        shadow = shadow or self.shadow_name(args, kwargs, options)
        options = dict(self._get_exec_options(), **options)
        dump_pydantic_arguments = getattr(self, "_dump_pydantic_arguments", None)  # Celery 5.5+ (pydantic=True)
        if dump_pydantic_arguments is not None:
            args, kwargs = dump_pydantic_arguments(args, kwargs)
        options.setdefault("ignore_result", self.ignore_result)
        task_id = task_id or celery_calls.new_task_id()  # on a shard of the caller's transaction
        celery_calls.store(app, self.name, args, kwargs, task_id, eta,
                           {**options, "link": link, "link_error": link_error, "shadow": shadow}, ttr=self.ttr)
        result = self.AsyncResult(task_id)
        result.ignored = options["ignore_result"]
        if options.get("add_to_parent", True):
            parent = app.current_worker_task
            if parent:
                parent.add_trail(result)
        return result

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        fields = None if request.called_directly else (request.headers or {}).get(FENCE_HEADER)
        if not fields:
            return super().__call__(*args, **kwargs)
        return _run_fenced(self, from_header(fields), super().__call__, args, kwargs)

    def on_failure(self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any) -> None:
        """Celery's worker calls this in its main process when it killed a task at its hard time
        limit: the task's own process cannot record that outcome."""
        if isinstance(exc, TimeLimitExceeded):
            _end_timed_out(task_id, exc)
        super().on_failure(exc, task_id, args, kwargs, einfo)


def _not_yet_due(app, eta, countdown):
    """The call's ETA (aware), as Celery works it out, if it is still to come; else None."""
    now = app.now()
    if countdown:  # Celery: a countdown wins over an eta
        eta = now + timedelta(seconds=countdown)
    elif not eta:
        return None
    elif isinstance(eta, str):
        eta = isoparse(eta)
    eta = maybe_make_aware(eta, tz=app.timezone)
    return eta if eta > now else None


def _run_fenced(task, fence, body, args, kwargs):
    """The worker's side: the compare-and-set start, the body, the outcome (durable/attempt.py)."""
    from timeouts.durable import attempt

    return attempt.run(task, fence, body, args, kwargs)


def _end_timed_out(task_id, exc):
    from timeouts.durable import attempt

    attempt.end_timed_out(task_id, shards.hashed(task_id).alias, exc)  # where celery_calls.store() put it
