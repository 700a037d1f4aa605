"""Three shards, two of them throwaway clusters, under faults: a shard's server crashes mid-load and
comes back (the other shards' tasks stay on time; its own are late, none lost), and one of two
dispatcher processes is killed (the other serves every shard on time). A real Celery worker and
real `timeouts_dispatcher` processes; the handlers record each start in the test database."""

import sys
import time
from contextlib import ExitStack, contextmanager
from datetime import timedelta

import psycopg
import pytest
from django.test import override_settings

from tests.support import processes
from timeouts.dispatch.listener import APPLICATION_NAME
from timeouts.storage import shards
from timeouts.store.queries import fetch_one
from timeouts.store.scheduling import prepare

from .clusters import CopiedPostgres

pytestmark = [pytest.mark.reliability, pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

ALIASES = ["default", "shard_b", "shard_c"]
ON_TIME = 1.0  # seconds: the most a start of a healthy shard's task may lag its action_time
COUNT = 150  # tasks, spread over SPREAD seconds from LEAD on
LEAD, SPREAD = 3.0, 9.0


@pytest.fixture
def clusters(postgres_template):
    """Throwaway clusters for shard_b and shard_c, migrated; the test database is `default`."""
    with ExitStack() as stack:
        yield {alias: stack.enter_context(CopiedPostgres(postgres_template)) for alias in ALIASES[1:]}


@pytest.fixture
def env(clusters):
    return processes.django_env(TIMEOUTS_TEST_SHARDS=",".join(ALIASES),
                                **{f"TIMEOUTS_TEST_{alias.upper()}_URL": cluster.url
                                   for alias, cluster in clusters.items()})


@pytest.fixture
def worker(env, broker):
    broker.flushdb()
    with processes.running_worker(env=env, name="worker-shards", concurrency=4) as process:
        yield process


def urls(clusters) -> dict[str, str]:
    return {"default": processes.database_url("default"), **{alias: c.url for alias, c in clusters.items()}}


@contextmanager
def dispatcher(env, name, urls_by_shard):
    process = processes.spawn([sys.executable, "manage.py", "timeouts_dispatcher"], env=env, log_name=name)
    try:
        processes.wait_for(lambda: all(listeners(url) for url in urls_by_shard.values()) or process.poll(), 30,
                           message="the dispatcher to listen on every shard")
        assert process.poll() is None, f"{name} exited with {process.returncode}"
        yield process
    finally:
        processes.stop(process)


def listeners(url) -> int:
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=2) as conn:
            return conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                                "AND datname = current_database()", [APPLICATION_NAME]).fetchone()[0]
    except psycopg.OperationalError:
        return 0


def schedule_spread(urls_by_shard) -> dict[str, set[int]]:
    """COUNT tasks due over SPREAD seconds from LEAD on, each inserted on its shard; job ids by shard."""
    made = {alias: set() for alias in ALIASES}
    with override_settings(TIMEOUTS={"SHARDS": ALIASES}), ExitStack() as stack:
        conns = {alias: stack.enter_context(psycopg.connect(url, autocommit=True))
                 for alias, url in urls_by_shard.items()}
        for n in range(COUNT):
            new = prepare("test.record", f"spread-{n}", delay=timedelta(seconds=LEAD + SPREAD * n / COUNT))
            place = shards.place(new.biz_type, new.biz_id)
            made[place.alias].add(fetch_one("insert_task", new.params(place.slot), using=conns[place.alias])["job_id"])
    return made


def lateness_by_job(starts) -> dict[int, list[float]]:
    seen = {}
    for job_id, _, action_time, started_at in starts.all():
        seen.setdefault(job_id, []).append((started_at - action_time).total_seconds())
    return seen


def test_a_shard_whose_server_crashes_delays_only_its_own_tasks_and_loses_none(clusters, env, worker, starts):
    by_shard = urls(clusters)
    with dispatcher(env, "dispatcher-shards", by_shard):
        made = schedule_spread(by_shard)
        time.sleep(LEAD + SPREAD / 3)
        clusters["shard_c"].stop("immediate")  # a crash, mid-load
        time.sleep(SPREAD / 3)
        clusters["shard_c"].start()
        processes.wait_for(lambda: starts.count() >= COUNT, 90, message="every task to start")
    seen = lateness_by_job(starts)
    assert set(seen) == set().union(*made.values())  # none lost
    healthy = [late for alias in ("default", "shard_b") for job_id in made[alias] for late in seen[job_id]]
    assert all(len(seen[job_id]) == 1 for alias in ("default", "shard_b") for job_id in made[alias])
    assert 0 <= min(healthy) and max(healthy) < ON_TIME, sorted(healthy)[-5:]
    assert min(late for runs in seen.values() for late in runs) >= 0  # never early, whatever happened
    assert max(late for job_id in made["shard_c"] for late in seen[job_id]) > ON_TIME  # it did wait


def test_a_killed_dispatcher_leaves_every_shard_to_the_other(clusters, env, worker, starts):
    by_shard = urls(clusters)
    with dispatcher(env, "dispatcher-kept", by_shard), dispatcher(env, "dispatcher-killed", by_shard) as doomed:
        made = schedule_spread(by_shard)
        time.sleep(LEAD + SPREAD / 3)
        doomed.kill()
        processes.wait_for(lambda: starts.count() >= COUNT, 60, message="every task to start")
    seen = lateness_by_job(starts)
    assert set(seen) == set().union(*made.values())
    assert all(len(runs) == 1 for runs in seen.values())
    assert 0 <= min(late for runs in seen.values() for late in runs)
    assert max(late for runs in seen.values() for late in runs) < ON_TIME
