"""Fair claiming: every claim (the dispatcher's and the scan's, one statement) is shared among the
biz_types that have due tasks, so a backlog of one delays another by one claim round at most;
within a biz_type, tasks are claimed in run_at order; and any number of claimers at once still
take different tasks (SKIP LOCKED)."""

import threading
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from tests.support.isolation import no_limits  # noqa: F401  (a fixture)
from timeouts.dispatch.claiming import claim_due
from timeouts.models import TimeoutTask

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120), pytest.mark.usefixtures("no_limits")]
Status = TimeoutTask.Status


def backlog(biz_type, n, *, seconds_ago=60.0, step=0.001):
    """n tasks of biz_type, all due, the oldest `seconds_ago` seconds ago and `step` apart."""
    start = datetime.now(UTC) - timedelta(seconds=seconds_ago)
    TimeoutTask.objects.bulk_schedule(
        [{"biz_type": biz_type, "biz_id": f"{biz_type}-{i}", "at": start + timedelta(seconds=i * step)}
         for i in range(n)])


def by_type(claims):
    return Counter(claim.biz_type for claim in claims)


def test_a_backlog_delays_another_biz_type_by_one_claim_at_most():
    backlog("test.record", 2000, seconds_ago=120)  # a large backlog, and older
    backlog("test.fail", 10, seconds_ago=1)
    first = claim_due(100)
    assert by_type(first) == {"test.fail": 10, "test.record": 90}
    assert by_type(claim_due(100)) == {"test.record": 100}


def test_within_a_biz_type_the_oldest_are_claimed_first():
    backlog("test.record", 300)
    backlog("test.fail", 300, seconds_ago=30)
    claims = claim_due(200)
    for biz_type in ("test.record", "test.fail"):
        ours = [claim for claim in claims if claim.biz_type == biz_type]
        expected = TimeoutTask.objects.filter(biz_type=biz_type).order_by("run_at")[:100]
        assert [claim.job_id for claim in sorted(ours, key=lambda c: c.run_at)] == [t.job_id for t in expected]


def test_a_claim_is_shared_equally_and_the_remainder_goes_to_the_longest_waiting():
    backlog("test.record", 100, seconds_ago=10)
    backlog("test.fail", 100, seconds_ago=30)  # waiting longest
    backlog("test.slow", 100, seconds_ago=20)
    assert by_type(claim_due(32)) == {"test.fail": 11, "test.slow": 11, "test.record": 10}


def test_what_a_small_biz_type_leaves_fills_the_claim_from_the_backlogs():
    backlog("test.record", 1000)
    backlog("test.fail", 3)
    backlog("test.slow", 1000)
    claims = claim_due(100)
    # Shares of 34 (the oldest), 33 and 33; the 30 that test.fail leaves go to the other two.
    assert by_type(claims) == {"test.record": 49, "test.fail": 3, "test.slow": 48}


def test_with_more_biz_types_than_the_claim_takes_one_each_of_the_longest_waiting():
    """Each biz_type takes one place, however long its backlog: its oldest task competes with the
    oldest of the others (earliest deadline first)."""
    kinds = ["test.record", "test.fail", "test.slow", "test.crash", "test.queued"]
    for age, biz_type in enumerate(kinds):
        backlog(biz_type, 1000 if biz_type == "test.queued" else 2, seconds_ago=10 + age, step=age + 1)
    # Oldest tasks: queued -14 s (then -9, -4, ...), crash -13 (-9), slow -12 (-9), fail -11 (-9), record -10 (-9).
    assert by_type(claim_due(3)) == {"test.queued": 1, "test.crash": 1, "test.slow": 1}
    second = by_type(claim_due(3))
    assert second["test.fail"] == second["test.record"] == 1 and sum(second.values()) == 3


def test_only_due_tasks_are_claimed_whatever_their_biz_type():
    backlog("test.record", 5)
    TimeoutTask.objects.schedule("test.fail", "later", delay=timedelta(hours=1))
    TimeoutTask.objects.schedule("test.slow", "much-later", delay=timedelta(days=5))
    claims = claim_due(100)
    assert by_type(claims) == {"test.record": 5}
    assert TimeoutTask.objects.filter(status=Status.PENDING).count() == 2


def test_a_single_biz_type_fills_the_claim_as_before():
    backlog("test.record", 250)
    assert len(claim_due(100)) == 100
    assert len(claim_due(100)) == 100
    assert len(claim_due(100)) == 50
    assert claim_due(100) == []


def test_many_claimers_at_once_take_different_tasks_and_together_all(settings):
    settings.TIMEOUTS = {"MAX_DISPATCHED": 10_000}  # no backpressure: nothing starts here
    backlog("test.record", 1500)
    backlog("test.fail", 500)
    backlog("test.slow", 7)
    claimed, errors = [], []

    def claimer():
        try:
            while claims := claim_due(50):
                claimed.extend(claim.job_id for claim in claims)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=claimer) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    assert len(claimed) == len(set(claimed)) == 2007
    assert not TimeoutTask.objects.filter(status=Status.PENDING).exists()
