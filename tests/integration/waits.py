"""Waiting in the integration tests for what the database can tell, bounded in time, rather than for
a fixed while."""

from django.db.models.functions import Now

from tests.support.processes import wait_for
from timeouts.models import TimeoutTask


def until_all_due(timeout=10.0):
    """Until no PENDING task is due later than now by the database clock, which the claim compares
    run_at with: a call stored with a short countdown, say, can then be claimed."""
    waiting = TimeoutTask.objects.filter(status=TimeoutTask.Status.PENDING, run_at__gt=Now())
    wait_for(lambda: not waiting.exists(), timeout, interval=0.01, message="every pending task to be due")
