"""The promise of timeouts, stated once and checked for every kind of work (a handler task, a
DurableTask call, a Django task: tests/conformance/kinds.py) in every deployment (Redis and
RabbitMQ; one database and three shards: conftest.py), on a real Celery worker with the real
dispatcher and scan. Each test runs every kind side by side in the same worker:

- never early, and exactly once without faults, also when the pool is busier than the lease and
  when a message is delivered twice;
- a cancel that returned True is final, also racing the claim and the start, and while the work
  waits for a pool process past its lease;
- a rollback of the caller's transaction leaves nothing on any database;
- a worker process killed mid-run: the work runs again (at least once), nothing is lost;
- failing or expired work ends in the state the docs give, and the admin shows it there.

docs/explanation/guarantees.md lists these checks.
"""

import os
import signal
import time
import uuid

import pytest
from django.db import transaction

import timeouts
from tests.conformance.kinds import rows_everywhere
from tests.support import processes
from tests.support.shards import ALIASES
from tests.testapp import conformance
from timeouts import ShardOutsideTransaction
from timeouts.dispatch.claiming import claim_due
from timeouts.dispatch.publishing import publish
from timeouts.models import TimeoutTask
from timeouts.storage import shards
from timeouts.store import worker_connection

Status = TimeoutTask.Status
FINAL = {Status.DONE, Status.CANCELLED, Status.DEAD}
pytestmark = [pytest.mark.django_db(transaction=True, databases=ALIASES), pytest.mark.slow, pytest.mark.one_leg,
              pytest.mark.timeout(90)]


class Rollback(Exception):
    pass


def schedule_many(kinds, count, delay, **behaviour) -> dict:
    """`count` pieces of work of each kind, {kind: {key: handle}}, the i-th due after delay(i)
    seconds (or `delay`). Keys are new for each call, and spread over the shards by their hash."""
    tag = uuid.uuid4().hex[:8]
    work = {}
    for i in range(count):
        for kind in kinds:
            key = f"conformance-{tag}-{kind.name}-{i}"
            work.setdefault(kind, {})[key] = kind.schedule(key, delay(i) if callable(delay) else delay, **behaviour)
    return work


def block_the_pool(seconds):
    """Both pool processes of the worker busy for `seconds`, from about 0.2 s on."""
    for i in range(2):
        timeouts.schedule(conformance.BLOCKER, f"block-{uuid.uuid4().hex[:8]}-{i}", delay=0.2,
                          attribute={"sleep": seconds})


def rows_of(work) -> dict:
    """{kind: {key: its row, or None}}."""
    return {kind: {key: kind.row(key, handle) for key, handle in of_kind.items()} for kind, of_kind in work.items()}


def settle(work, timeout=40) -> dict:
    """Wait until every piece of work has ended (DONE, CANCELLED or DEAD); then a moment more, in
    which a second run would show. Returns rows_of(work)."""

    def ended():
        return all(row is not None and row.status in FINAL for rows in rows_of(work).values() for row in rows.values())

    processes.wait_for(ended, timeout, interval=0.1, message="every piece of work to end")
    time.sleep(0.5)
    return rows_of(work)


def statuses(rows) -> dict:
    return {key: Status(row.status).name for key, row in rows.items()}


def test_each_runs_once_and_never_early(kinds, runs, dispatched):
    work = schedule_many(kinds, 6, delay=lambda i: 0.6 + i * 0.05)
    for kind, rows in settle(work).items():
        assert statuses(rows) == dict.fromkeys(rows, "DONE"), kind.name
        for key, row in rows.items():
            started = [started_at for _, _, started_at in runs.of(kind.name, key)]
            assert len(started) == 1, f"{kind.name} {key} ran {len(started)} times"
            assert started[0] >= row.action_time, f"{kind.name} {key} started {row.action_time - started[0]} early"


def test_each_runs_once_when_the_pool_is_busier_than_its_lease(kinds, runs, dispatched):
    block_the_pool(conformance.TTR + 1.5)
    work = schedule_many(kinds, 2, delay=0.8)
    for kind, rows in settle(work).items():
        assert statuses(rows) == dict.fromkeys(rows, "DONE"), kind.name
        assert sorted(runs.keys(kind)) == sorted(rows), f"each {kind.name} must run once"


def test_a_message_delivered_twice_runs_once(kinds, runs, placed):
    work = schedule_many(kinds, 2, delay=0.3)
    time.sleep(0.5)
    claimed = 0
    for alias in shards.aliases():
        with worker_connection.shared(alias):
            claims = claim_due(100)
            publish(claims)
            publish(claims)
            claimed += len(claims)
    assert claimed == sum(map(len, work.values()))
    with processes.scanning(conformance.TTR):  # only for a lease that runs out: none should
        settled = settle(work)
    for kind, rows in settled.items():
        assert statuses(rows) == dict.fromkeys(rows, "DONE"), kind.name
        assert sorted(runs.keys(kind)) == sorted(rows), f"each {kind.name} must run once"


def test_a_true_cancel_is_final_racing_the_claim_and_the_start(kinds, runs, dispatched):
    # Every other piece of work cancelled around its due time: before, at, or just after it, while
    # it is claimed, published, started.
    offsets = [-0.02, 0.0, 0.003, 0.01, 0.03]
    began = time.monotonic()
    due = [1.0 + 0.05 * i for i in range(12)]
    work = schedule_many(kinds, len(due), delay=lambda i: due[i])
    cancelled = set()
    for i in range(0, len(due), 2):
        for n, kind in enumerate(kinds):
            time.sleep(max(0.0, began + due[i] + offsets[(i // 2 + n) % len(offsets)] - time.monotonic()))
            key = list(work[kind])[i]
            if kind.cancel(work[kind][key]):
                cancelled.add(key)
    settled = settle(work)
    for kind, rows in settled.items():
        ran = runs.keys(kind)
        assert len(ran) == len(set(ran)), f"a {kind.name} ran twice"
        assert not set(ran) & cancelled, f"a cancel of a {kind.name} returned True and it ran"
        assert set(ran) | (cancelled & set(rows)) == set(rows), f"a {kind.name} was lost"
        assert all(rows[key].status == Status.CANCELLED for key in cancelled & set(rows))


def test_a_true_cancel_is_final_while_it_waits_past_its_lease(kinds, runs, dispatched):
    block_the_pool(conformance.TTR + 2.5)
    work = schedule_many(kinds, 2, delay=0.6)
    # Claimed, waiting in the worker for a process: its lease runs out, the scan may recover it.
    time.sleep(0.6 + conformance.TTR + 0.6)
    cancelled = {key for of_kind in work.values() for key, handle in of_kind.items()
                 if next(kind for kind in kinds if key in work[kind]).cancel(handle)}
    for kind, rows in settle(work).items():
        ran = runs.keys(kind)
        assert not set(ran) & cancelled, f"a cancel of a {kind.name} returned True and it ran"
        assert sorted(ran) == sorted(set(rows) - cancelled), f"each {kind.name} not cancelled must run once"


def test_a_rollback_leaves_nothing_on_any_database(kinds, runs, dispatched):
    refused = 0
    with pytest.raises(Rollback), transaction.atomic():
        for kind in kinds:
            for i in range(6):
                try:
                    kind.schedule(f"conformance-{uuid.uuid4().hex[:8]}-{i}", 0.3)
                except ShardOutsideTransaction:  # its shard is outside the caller's transaction
                    refused += 1
        raise Rollback
    with pytest.raises(Rollback), atomic_everywhere():
        schedule_many(kinds, 6, delay=0.3)
        raise Rollback
    time.sleep(1.5)
    assert rows_everywhere() == 0
    assert runs.all() == []
    if shards.aliases() == ["default"]:
        assert refused == 0


class atomic_everywhere:
    """One transaction on each test database, as a caller that opens them all knowingly."""

    def __enter__(self):
        self.blocks = [transaction.atomic(using=alias) for alias in ALIASES]
        for block in self.blocks:
            block.__enter__()

    def __exit__(self, *exc_info):
        for block in reversed(self.blocks):
            block.__exit__(*exc_info)


def test_a_worker_process_killed_mid_run_runs_it_again(kinds, runs, dispatched):
    work = schedule_many(kinds, 1, delay=0.3, sleep=conformance.TTR / 2)
    kill_each_first_run(runs, {kind.name: key for kind, of_kind in work.items() for key in of_kind})
    for kind, rows in settle(work, timeout=60).items():
        assert statuses(rows) == dict.fromkeys(rows, "DONE"), kind.name
        assert all(len(runs.of(kind.name, key)) >= 2 for key in rows), f"a killed {kind.name} must run again"


def kill_each_first_run(runs, keys, timeout=20):
    """SIGKILL the process of each first run of `keys` ({kind name: key}) as soon as it shows (the
    work sleeps at the start of its first run)."""
    deadline = time.monotonic() + timeout
    while keys:
        assert time.monotonic() < deadline, f"no first run of {keys}"
        for name, key in list(keys.items()):
            found = runs.of(name, key)
            if found:
                os.kill(found[0][1], signal.SIGKILL)
                del keys[name]
        time.sleep(0.02)


def test_failing_work_ends_dead_and_the_admin_shows_it(kinds, runs, dispatched, admin_client):
    for kind, rows in settle(schedule_many(kinds, 1, delay=0.3, fail=True)).items():
        [row] = rows.values()
        assert Status(row.status).name == "DEAD", kind.name
        assert "failing on purpose" in row.last_error, kind.name
        assert_listed(admin_client, row, Status.DEAD)


def test_expired_work_ends_cancelled_says_so_and_never_runs(kinds, runs, dispatched, admin_client):
    expiring = [kind for kind in kinds if kind.expires]
    for kind, rows in settle(schedule_many(expiring, 1, delay=0.6, expires=0.2)).items():
        [row] = rows.values()
        assert Status(row.status).name == "CANCELLED" and "expired" in row.last_error, kind.name
        assert runs.all(kind.name) == []
        assert_listed(admin_client, row, Status.CANCELLED)


def assert_listed(admin_client, row, status):
    page = admin_client.get("/admin/timeouts/timeouttask/", {"status": int(status)})
    assert page.status_code == 200
    assert str(row.job_id) in page.content.decode()
