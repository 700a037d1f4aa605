"""The promise, with timeouts.testing.run_due as the runner: every kind of work (kinds.py) in each
placement (one database; three shards), run in this process inside the test's transaction, with
no worker, dispatcher or broker. What run_due keeps of it:

- each piece of work runs once, and not before `until` reaches its time;
- a cancel that returned True is final;
- failing work ends DEAD, saying why, and expired work CANCELLED without running.

test_promise.py holds the same kinds to the whole promise on real workers.
"""

import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from tests.conformance.kinds import KINDS
from tests.support.shards import ALIASES
from tests.testapp import conformance, recorder
from timeouts.models import TimeoutTask
from timeouts.testing import run_due

Status = TimeoutTask.Status
PLACEMENTS = {"one database": ["default"], "three shards": ALIASES}
pytestmark = [pytest.mark.django_db(databases=ALIASES), pytest.mark.timeout(60)]


@pytest.fixture(scope="module")
def runs_table(django_db_setup, django_db_blocker):
    """The table perform() records runs in, committed: it records them on a connection of its own."""
    with django_db_blocker.unblock(), connection.cursor() as cursor:
        cursor.execute(conformance.TABLE_SQL)
    yield
    recorder.close()


@pytest.fixture(params=list(PLACEMENTS), ids=[name.replace(" ", "-") for name in PLACEMENTS])
def placed(request, settings, runs_table):
    settings.TIMEOUTS = {**settings.TIMEOUTS, "SHARDS": PLACEMENTS[request.param]}


def schedule(count, delay, **behaviour) -> dict:
    """`count` pieces of work of each kind, {kind: {key: handle}}, due after `delay` seconds (a
    countdown of 0 would publish a call at once, as Celery does)."""
    tag = uuid.uuid4().hex[:8]
    work = {}
    for kind in KINDS.values():
        for i in range(count):
            key = f"run-due-{tag}-{kind.name}-{i}"
            work.setdefault(kind, {})[key] = kind.schedule(key, delay, **behaviour)
    return work


def runs_of(kind, key) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM timeouts_test_conformance WHERE kind = %s AND key = %s", [kind.name, key])
        return cursor.fetchone()[0]


def later(**delta):
    return timezone.now() + timedelta(**delta)


def test_each_runs_once_and_not_before_until_reaches_it(placed):
    work = schedule(3, delay=600)

    assert run_due() == 0
    assert run_due(until=later(minutes=11)) == 3 * len(KINDS)
    for kind, of_kind in work.items():
        for key, handle in of_kind.items():
            assert runs_of(kind, key) == 1, f"{kind.name} {key}"
            assert kind.row(key, handle).status == Status.DONE, f"{kind.name} {key}"
    assert run_due(until=later(days=1)) == 0


def test_a_true_cancel_is_final(placed):
    work = schedule(4, delay=60)
    cancelled = {key for kind, of_kind in work.items() for key, handle in list(of_kind.items())[::2]
                 if kind.cancel(handle)}
    assert len(cancelled) == 2 * len(KINDS)

    assert run_due(until=later(minutes=2)) == 2 * len(KINDS)
    for kind, of_kind in work.items():
        for key, handle in of_kind.items():
            assert runs_of(kind, key) == (0 if key in cancelled else 1), f"{kind.name} {key}"
            if key in cancelled:
                assert kind.row(key, handle).status == Status.CANCELLED


def test_failing_work_ends_dead_saying_why(placed):
    work = schedule(1, delay=1, fail=True)

    run_due(until=later(hours=1))
    for kind, of_kind in work.items():
        [(key, handle)] = of_kind.items()
        row = kind.row(key, handle)
        assert row.status == Status.DEAD, kind.name
        assert "failing on purpose" in row.last_error, kind.name
        # A handler and a Django task are retried (conformance.MAX_ATTEMPTS); a call's failure is final.
        assert runs_of(kind, key) == (1 if kind.name == "durable" else conformance.MAX_ATTEMPTS), kind.name


def test_expired_work_ends_cancelled_and_never_runs(placed):
    expiring = [kind for kind in KINDS.values() if kind.expires]
    for kind in expiring:
        key = f"run-due-{uuid.uuid4().hex[:8]}-{kind.name}"
        handle = kind.schedule(key, 60, expires=later(seconds=-1))

        assert run_due(until=later(minutes=2)) == 0
        row = kind.row(key, handle)
        assert row.status == Status.CANCELLED and "expired" in row.last_error, kind.name
        assert runs_of(kind, key) == 0, kind.name
