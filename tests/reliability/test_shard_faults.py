"""Three shards, two of them throwaway clusters, under faults: a shard's server crashes mid-load and
comes back (the other shards' tasks stay on time; its own are late, none lost), and one of two
dispatcher processes is killed (the other serves every shard on time; a claim the killed one had
committed but not published yet starts once its lease runs out, at the next scan). A real Celery
worker and real `timeouts_dispatcher` processes; the handlers record each start in the test
database."""

import dataclasses
import sys
import time
from contextlib import ExitStack, contextmanager
from datetime import timedelta
from urllib.parse import urlsplit

import psutil
import psycopg
import pytest
from django.test import override_settings

from tests.support import processes
from timeouts.dispatch.listener import APPLICATION_NAME
from timeouts.states import Status
from timeouts.storage import shards
from timeouts.store.queries import fetch_one
from timeouts.store.scheduling import prepare

from .clusters import CopiedPostgres

pytestmark = [pytest.mark.reliability, pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

ALIASES = ["default", "shard_b", "shard_c"]
ON_TIME = 1.0  # seconds: the most a start of a healthy shard's task may lag its action_time
COUNT = 150  # tasks, spread over SPREAD seconds from LEAD on
LEAD, SPREAD = 3.0, 9.0
# Seconds: the lease of a claim, short so that a claim a killed dispatcher left unpublished is taken
# back soon after the spread, within a wait that stays short.
TTR = 5
SCAN_INTERVAL = 0.5  # seconds between the lease recoveries (and claims) of the scan that takes them back


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


@contextmanager
def scanning(env):
    """The safety scan (as beat runs it: lease recovery, then due tasks) in a process of its own, every
    SCAN_INTERVAL, on every shard, until the block ends."""
    process = processes.spawn([sys.executable, "-m", "benchmarks.scan_loop", "--interval", str(SCAN_INTERVAL)],
                              env=env, log_name="scanner-shards")
    try:
        yield process
    finally:
        processes.stop(process)


def client_ports(process, url) -> set[int]:
    """The local ports of the process's connections to the server of `url`: its sessions' client_port
    in pg_stat_activity there."""
    port = urlsplit(url).port or 5432
    return {conn.laddr.port for conn in psutil.Process(process.pid).net_connections("tcp")
            if conn.raddr and conn.raddr.port == port}


def sessions(url, ports) -> int:
    """How many of these client ports still have a session on the server of `url`."""
    with psycopg.connect(url, autocommit=True, connect_timeout=2) as conn:
        return conn.execute("SELECT count(*) FROM pg_stat_activity WHERE client_port = ANY(%s)",
                            [sorted(ports)]).fetchone()[0]


def schedule_spread(urls_by_shard, ttr=None) -> dict[str, set[int]]:
    """COUNT tasks due over SPREAD seconds from LEAD on, each inserted on its shard; job ids by shard.
    `ttr`: their lease, if not the handler's."""
    made = {alias: set() for alias in ALIASES}
    with override_settings(TIMEOUTS={"SHARDS": ALIASES}), ExitStack() as stack:
        conns = {alias: stack.enter_context(psycopg.connect(url, autocommit=True))
                 for alias, url in urls_by_shard.items()}
        for n in range(COUNT):
            new = prepare("test.record", f"spread-{n}", delay=timedelta(seconds=LEAD + SPREAD * n / COUNT))
            if ttr is not None:
                new = dataclasses.replace(new, ttr=ttr)
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
    """The kept dispatcher starts every task on time but those the killed one had claimed (committed)
    and not published when it died: nothing publishes those until their lease runs out and a scan
    takes them back, and then each starts once."""
    by_shard = urls(clusters)
    with dispatcher(env, "dispatcher-kept", by_shard), dispatcher(env, "dispatcher-killed", by_shard) as doomed:
        made = schedule_spread(by_shard, ttr=TTR)
        spread_ends = time.monotonic() + LEAD + SPREAD
        time.sleep(LEAD + SPREAD / 3)
        ports = {url: client_ports(doomed, url) for url in by_shard.values()}
        doomed.kill()
        doomed.wait(10)
        # Once its sessions are gone, no claim of the killed dispatcher can commit any more.
        processes.wait_for(lambda: not any(sessions(url, own) for url, own in ports.items() if own), 10,
                           message="the killed dispatcher's sessions to end")
        with psycopg.connect(by_shard["default"], autocommit=True) as conn:
            killed_at = conn.execute("SELECT clock_timestamp()").fetchone()[0]
        time.sleep(max(0.0, spread_ends + ON_TIME - time.monotonic()))
        stranded = unstarted_claims(by_shard, made, {job_id for job_id, *_ in starts.all()})
        assert all(status == Status.DISPATCHED and claimed_at < killed_at
                   for status, claimed_at in stranded.values()), stranded  # claimed by the killed one
        # ...in its last claim on each shard: it publishes a claim before it makes the next one there.
        assert all(len({stranded[job_id][1] for job_id in made[alias] & set(stranded)}) <= 1 for alias in ALIASES)
        if stranded:
            with scanning(env):
                processes.wait_for(lambda: starts.count() >= COUNT, TTR + 30, message="every task to start")
    seen = lateness_by_job(starts)
    assert set(seen) == set().union(*made.values())
    assert all(len(runs) == 1 for runs in seen.values())
    assert 0 <= min(late for runs in seen.values() for late in runs)
    assert max(late for job_id, runs in seen.items() if job_id not in stranded for late in runs) < ON_TIME
    started_at = {job_id: started for job_id, _, _, started in starts.all()}
    assert all(started_at[job_id] >= claimed_at + timedelta(seconds=TTR)  # never published: its lease ran out
               for job_id, (_, claimed_at) in stranded.items())


def unstarted_claims(urls_by_shard, made, started) -> dict[int, tuple[int, object]]:
    """{job_id: (status, dispatched_at)} of the tasks made that have not started, read on their shards."""
    found = {}
    for alias, url in urls_by_shard.items():
        waiting = sorted(made[alias] - started)
        if waiting:
            with psycopg.connect(url, autocommit=True) as conn:
                found.update((job_id, (status, at)) for job_id, status, at in conn.execute(
                    "SELECT job_id, status, dispatched_at FROM timeouts_task WHERE job_id = ANY(%s)", [waiting]))
    return found
