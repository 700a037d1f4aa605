"""The kinds of work the promise holds for, behind one interface: schedule a piece of work for a
key, cancel it, find its row. A new kind joins the conformance suite by adding a class here and
its name to KINDS.

Each kind's work is tests/testapp/conformance.py's `perform()`, which records its runs by key.
"""

from datetime import timedelta

from django.utils import timezone

import timeouts
import timeouts.backends
import timeouts.celery
from tests.support.shards import ALIASES
from tests.testapp import conformance
from timeouts.backends.results import parse_result_id
from timeouts.durable.calls import biz_type_for
from timeouts.models import TimeoutTask
from timeouts.storage import shards


class Handler:
    """A handler task: `timeouts.schedule()` of a registered biz_type."""

    name = "handler"
    expires = False

    def schedule(self, key, delay, **behaviour):
        return timeouts.schedule(conformance.HANDLER, key, delay=timedelta(seconds=delay), attribute=behaviour)

    def cancel(self, handle) -> bool:
        return handle.cancel()

    def row(self, key, handle):
        return _find(biz_type=conformance.HANDLER, biz_id=key)


class DurableCall:
    """A `DurableTask` call with a countdown: stored, then published as the Celery task's own message."""

    name = "durable"
    expires = True

    def schedule(self, key, delay, expires=None, **behaviour):
        return conformance.run_call.apply_async((behaviour,), task_id=key, countdown=delay, expires=expires)

    def cancel(self, handle) -> bool:
        return timeouts.celery.cancel(handle.id)

    def row(self, key, handle):
        return _find(biz_type=biz_type_for(conformance.run_call.name), biz_id=key)


class DjangoTask:
    """A task of Django's tasks framework on `timeouts.backends.TimeoutsBackend`, with a run_after."""

    name = "django_task"
    expires = False

    def schedule(self, key, delay, **behaviour):
        run_after = timezone.now() + timedelta(seconds=delay)
        return conformance.run_django_task.using(run_after=run_after).enqueue(key, behaviour)

    def cancel(self, handle) -> bool:
        return timeouts.backends.cancel(handle.id)

    def row(self, key, handle):
        return _find(job_id=parse_result_id(handle.id)["job_id"])


KINDS = {kind.name: kind for kind in (Handler(), DurableCall(), DjangoTask())}


def _find(**lookup):
    """The row, on whichever shard holds it, or None."""
    for alias in shards.aliases():
        row = TimeoutTask.objects.using(alias).filter(**lookup).first()
        if row is not None:
            return row
    return None


def rows_everywhere() -> int:
    """How many rows the test databases hold, shards or not."""
    return sum(TimeoutTask.objects.using(alias).count() for alias in ALIASES)
