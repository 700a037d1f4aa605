"""The claim honours the limits and pauses of timeouts_limits: a paused biz_type is not claimed, a
concurrency limit counts what is claimed or running, a rate limit is a token bucket of claims; held
tasks wait PENDING (late, never lost); and all of it holds with several claimers at once, each on
its own connection, and when a pause races a claim."""

import itertools
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction

import timeouts
from tests.support.isolation import no_limits  # noqa: F401  (a fixture)
from tests.support.processes import wait_for
from timeouts import registry
from timeouts.dispatch.claiming import claim_due
from timeouts.models import TimeoutTask

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120), pytest.mark.usefixtures("no_limits")]
Status = TimeoutTask.Status


def backlog(biz_type, n, *, seconds_ago=60.0):
    start = datetime.now(UTC) - timedelta(seconds=seconds_ago)
    TimeoutTask.objects.bulk_schedule(
        [{"biz_type": biz_type, "biz_id": f"{biz_type}-{i}", "at": start + timedelta(milliseconds=i)}
         for i in range(n)])


def by_type(claims):
    return Counter(claim.biz_type for claim in claims)


def finish(claims):
    """What a worker would do: start and end them (RUNNING, then DONE)."""
    ids = [claim.job_id for claim in claims]
    with connection.cursor() as cursor:
        cursor.execute("UPDATE timeouts_task SET status = %s, lease_until = NULL, started_at = now(), "
                       "finished_at = now(), attempts = attempts + 1 WHERE job_id = ANY(%s)", [Status.DONE, ids])


def test_a_paused_biz_type_is_not_claimed_and_waits_until_resumed():
    backlog("test.record", 10)
    backlog("test.fail", 10)
    timeouts.pause("test.record")
    assert by_type(claim_due(100)) == {"test.fail": 10}
    assert claim_due(100) == []
    assert TimeoutTask.objects.filter(biz_type="test.record", status=Status.PENDING).count() == 10
    timeouts.resume("test.record")
    assert by_type(claim_due(100)) == {"test.record": 10}


def test_a_concurrency_limit_counts_claimed_and_running_tasks():
    backlog("test.record", 20)
    timeouts.set_limits("test.record", concurrency=3)
    first = claim_due(100)
    assert len(first) == 3
    assert claim_due(100) == []  # three claimed, none started: the limit is reached
    with connection.cursor() as cursor:  # one starts: still three in flight
        cursor.execute("UPDATE timeouts_task SET status = %s, attempts = 1, started_at = now() WHERE job_id = %s",
                       [Status.RUNNING, first[0].job_id])
    assert claim_due(100) == []
    finish(first[:2])  # two end: two slots
    assert len(claim_due(100)) == 2


def test_a_concurrency_limit_leaves_the_claim_to_the_other_biz_types():
    backlog("test.record", 200)
    backlog("test.fail", 200)
    timeouts.set_limits("test.record", concurrency=5)
    assert by_type(claim_due(100)) == {"test.record": 5, "test.fail": 95}


def test_a_rate_limit_allows_a_twentieth_of_a_second_s_worth_at_once_then_the_rate():
    backlog("test.record", 1000)
    timeouts.set_limits("test.record", rate_limit=200)
    started = time.monotonic()
    assert len(claim_due(100)) == 10  # the burst: 200 / 20
    total = 10
    while time.monotonic() - started < 1.0:
        total += len(claim_due(100))
        time.sleep(0.02)
    elapsed = time.monotonic() - started
    # Refilled at 200/s meanwhile, never more than the rate allows in any second (the burst included).
    assert 10 + 200 * (elapsed - 0.3) <= total <= 200 * elapsed + 10
    assert total <= 200 * 1.05 + 1


def test_a_rate_below_twenty_per_second_claims_one_at_a_time():
    backlog("test.record", 100)
    timeouts.set_limits("test.record", rate_limit=10)
    assert len(claim_due(100)) == 1
    assert claim_due(100) == []
    time.sleep(0.15)  # a tenth of a second at 10/s: one more, not more
    assert len(claim_due(100)) == 1


def test_a_rate_below_one_per_second_claims_one_at_a_time():
    backlog("test.record", 5)
    timeouts.set_limits("test.record", rate_limit=0.5)
    assert len(claim_due(100)) == 1
    assert claim_due(100) == []


def test_the_handlers_own_limits_apply_once_declared():
    from timeouts.limiting import controls

    timeouts.handler("test.declared", concurrency=2)(lambda task: None)
    try:
        backlog("test.declared", 10)
        controls.declare()
        assert len(claim_due(100)) == 2
    finally:
        registry.unregister("test.declared")


def claim_in_threads(n_threads, rounds, pause=0.0, took=None):
    """Claims from n_threads threads (each its own connection) at once; returns every claim, and
    adds to `took` how long each round (a claim and the pause) took."""
    claimed, errors = [], []
    took = [] if took is None else took
    barrier = threading.Barrier(n_threads)

    def claimer():
        try:
            barrier.wait()
            for _ in range(rounds):
                began = time.monotonic()
                claimed.extend(claim_due(50))
                time.sleep(pause)
                took.append(time.monotonic() - began)
        except Exception as exc:  # reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=claimer) for _ in range(n_threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors, errors
    return claimed


def test_a_concurrency_limit_holds_across_claimers_at_once():
    backlog("test.record", 500)
    backlog("test.fail", 500)
    timeouts.set_limits("test.record", concurrency=7)
    claimed = claim_in_threads(6, rounds=5)
    assert by_type(claimed)["test.record"] == 7
    assert len({claim.job_id for claim in claimed}) == len(claimed)


def test_a_rate_limit_holds_across_claimers_at_once():
    backlog("test.record", 1000)
    timeouts.set_limits("test.record", rate_limit=10)
    took = []
    started = time.monotonic()
    claimed = claim_in_threads(6, rounds=10, pause=0.05, took=took)
    elapsed, round_ = time.monotonic() - started, max(took)
    times = sorted(claim.claimed_at for claim in claimed)  # each claim's now(), which its tokens count from
    gaps = [(later - earlier).total_seconds() for earlier, later in itertools.pairwise(times)]
    # The burst of one, then never more than one claim a tenth of a second, by the database clock.
    assert min(gaps) >= 0.1 - 1e-6, gaps
    # Nor fewer, but for the claimers' own pace: a token waits for the next claim that finds it, and
    # a claim that overlapped the one before leaves the biz_type alone, so within two rounds (a
    # claim and the pause, however long the machine takes for them), from the first round to the last.
    assert max(gaps) <= 0.1 + 2 * round_, (gaps, round_)
    assert len(claimed) >= 1 + (elapsed - 2 * round_) / (0.1 + 2 * round_), (len(claimed), elapsed, round_)


def test_a_pause_racing_a_claim_leaves_nothing_claimed_after_it_commits():
    """pause() and claims on separate connections: once pause() has committed, no claim that
    starts afterwards takes a task of that biz_type."""
    backlog("test.record", 3000)
    stop = threading.Event()
    after_pause = []
    paused_at = []
    names = [f"claimer {i}" for i in range(3)]
    claimed_before = dict.fromkeys(names, 0)  # tasks each claimer took in claims begun before the pause
    rounds_after = dict.fromkeys(names, 0)  # claims each claimer began after the pause

    def claimer():
        me = threading.current_thread().name
        try:
            while not stop.is_set():
                began = time.monotonic()
                claims = claim_due(5)
                if paused_at and began > paused_at[0]:
                    after_pause.extend(claims)
                    rounds_after[me] += 1
                else:
                    claimed_before[me] += len(claims)
                finish(claims)
        finally:
            connection.close()

    threads = [threading.Thread(target=claimer, name=name) for name in names]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: min(claimed_before.values()) > 0, 30, message="every claimer to take tasks")
        timeouts.pause("test.record")
        paused_at.append(time.monotonic())
        wait_for(lambda: min(rounds_after.values()) >= 10, 30, message="ten claims of each claimer after the pause")
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    assert after_pause == []
    left = TimeoutTask.objects.filter(status=Status.PENDING).count()
    assert 0 < left < 3000
    timeouts.resume("test.record")
    claimed = 0
    while claims := claim_due(500):
        claimed += len(claims)
        finish(claims)
    assert claimed == left


def test_set_limits_inside_a_transaction_applies_when_it_commits():
    backlog("test.record", 10)
    with transaction.atomic():
        timeouts.set_limits("test.record", concurrency=1)
        # Another connection claims meanwhile: the limit is not committed yet.
        claims = []
        thread = threading.Thread(target=lambda: (claims.extend(claim_due(3)), connection.close()))
        thread.start()
        thread.join(30)
    assert len(claims) == 3
    assert claim_due(100) == []  # 3 in flight, limit 1


# Rows written by hand, past what the API accepts but within the table's CHECK constraints: the
# columns of test.record's row besides an override and a bucket last refilled `refilled` seconds ago.
EXTREME_ROWS = {
    "a rate of one start in 300,000 years": {"rate_limit": 1e-13, "refilled": 0},
    "the smallest float8 rate": {"rate_limit": 5e-324, "refilled": 0},
    "the largest float8 rate": {"rate_limit": 1.7e308, "refilled": 3600},
    "the smallest float8 share of a rate": {"rate_limit": 1 / 86400, "rate_share": 5e-324, "refilled": 0},
    "the largest integer concurrency": {"concurrency": 2**31 - 1, "refilled": 0},
    "a bucket of the largest float8": {"rate_limit": 1e6, "tokens": 1.7e308, "refilled": 3600},
}


def dispatcher_statements(shard_index, shard_count):
    """What a dispatcher of the shard `shard_index` of `shard_count` runs: its claim, then the
    deadline it sleeps until."""
    from timeouts.store.queries import fetch_dicts, fetch_one

    claimed = fetch_dicts("claim_due", {"limit": 100, "lead": 0.0, "max_dispatched": 10_000,
                                        "shard_index": shard_index, "shard_count": shard_count,
                                        "attribute_prefixes": registry.attribute_prefixes()})
    deadline = fetch_one("claimable_deadline", {"concurrency_poll": 1.0, "shard_index": shard_index,
                                                "shard_count": shard_count})
    return Counter(row["biz_type"] for row in claimed), deadline


@pytest.mark.parametrize("row", EXTREME_ROWS)
@pytest.mark.parametrize(("shard_index", "shard_count"), [(0, 1), (2, 3)], ids=["one shard", "third of three"])
def test_a_limits_row_with_extreme_values_never_breaks_the_claim_of_the_other_biz_types(row, shard_index,
                                                                                          shard_count):
    columns = {"rate_limit": None, "concurrency": None, "rate_share": None, "tokens": 0.0, **EXTREME_ROWS[row]}
    backlog("test.record", 5)
    backlog("test.fail", 5)
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO timeouts_limits (biz_type, overridden, rate_limit, concurrency, rate_share, "
                       "tokens, refilled_at) VALUES ('test.record', true, %(rate_limit)s, %(concurrency)s, "
                       "%(rate_share)s, %(tokens)s, now() - %(refilled)s * interval '1 second')", columns)
    claimed, deadline = dispatcher_statements(shard_index, shard_count)
    assert claimed["test.fail"] == 5
    assert deadline["held"]
    again, deadline = dispatcher_statements(shard_index, shard_count)
    assert again["test.fail"] == 0 and claimed["test.record"] + again["test.record"] <= 5
    assert deadline["held"]
