"""What the tests that drive the worker's steps in the test process share: the claim of the one task
due, a statement on the test's connection, a call in a thread of its own, on a connection of its
own (the other side of a race), and a cancel that holds its row lock there."""

import threading

from django.db import connection, connections, transaction

from timeouts.dispatch.claiming import claim_due
from timeouts.models import TimeoutTask


def claim_one():
    """The claim of the one task due now (the test fails if there are more, or none)."""
    [claim] = claim_due(10)
    return claim


def sql(statement, params=()):
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def in_thread(func):
    """Start func() in a thread; returns (the thread, {"value": what it returned, or "error": what it
    raised}). The thread's database connections (to every database it used) are closed when func() ends."""
    result = {}

    def target():
        try:
            result["value"] = func()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            result["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=target)
    thread.start()
    return thread, result


def cancel_and_hold(job_id):
    """Cancel the task in a transaction of another thread that keeps the row locked until told to
    commit: (the thread, its result as in_thread's, an Event set once the row is locked, an Event
    to set for the commit)."""
    locked, release = threading.Event(), threading.Event()

    def cancel():
        with transaction.atomic():
            cancelled = TimeoutTask.objects.get(job_id=job_id).cancel()
            locked.set()
            release.wait(10)
        return cancelled

    thread, result = in_thread(cancel)
    return thread, result, locked, release
