"""The deployments the conformance suite runs against: each broker (Redis, RabbitMQ) times each
placement (one database; three shards), with a real Celery worker (prefork, 2 processes) started
once per deployment, and per test a dispatcher (in a thread of this process, one per shard) and
the safety scan, which also recovers expired leases.

A new placement joins by adding an entry to PLACEMENTS; a new broker, to BROKERS.
"""

import threading
from contextlib import contextmanager

import pytest
from django.db import connection, connections

from tests.conformance.kinds import KINDS
from tests.support import processes
from tests.support.brokers import VirtualHost, celery_on, rabbitmq_missing
from tests.support.isolation import forget_limits
from tests.support.shards import ALIASES
from tests.testapp import conformance
from timeouts.dispatch import dispatcher as dispatching

PLACEMENTS = {"one database": ["default"], "three shards": ALIASES}
BROKERS = ("redis", "rabbitmq")
DEPLOYMENTS = [(broker, placement) for broker in BROKERS for placement in PLACEMENTS]
# How often the safety scan runs here: it recovers leases that ran out, so what a lease does shows soon.
SCAN_INTERVAL = 0.2


@pytest.fixture(scope="module", params=DEPLOYMENTS, ids=[f"{b}-{p.replace(' ', '-')}" for b, p in DEPLOYMENTS])
def deployment(request, django_db_setup, django_db_blocker, broker):
    """(broker, placement), with a worker consuming on that broker and reading those shards."""
    broker_name, placement = request.param
    with pytest.MonkeyPatch.context() as monkeypatch, _on(broker_name, broker, monkeypatch):
        with django_db_blocker.unblock():
            with connection.cursor() as cursor:
                cursor.execute(conformance.TABLE_SQL)
            env = processes.django_env(TIMEOUTS_TEST_SHARDS=",".join(PLACEMENTS[placement]))
        with processes.running_worker(env=env, name=f"conformance-{broker_name}-{len(PLACEMENTS[placement])}"):
            yield broker_name, placement


@contextmanager
def _on(broker_name, redis_broker, monkeypatch):
    if broker_name == "redis":
        redis_broker.flushdb()
        yield
        return
    missing = rabbitmq_missing()
    if missing:
        pytest.skip(missing)
    with VirtualHost() as vhost, celery_on(vhost.url, monkeypatch):
        yield


@pytest.fixture
def placed(deployment, settings, transactional_db):
    """This test's settings name the deployment's shards, with no limits stored on any database."""
    settings.TIMEOUTS = {**settings.TIMEOUTS, "SHARDS": PLACEMENTS[deployment[1]]}
    forget_limits(ALIASES)
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE timeouts_test_conformance")
    yield deployment
    forget_limits(ALIASES)


@pytest.fixture
def dispatched(placed):
    """A dispatcher per shard and the safety scan, in threads of this process, for the test."""
    with dispatchers(), processes.scanning(SCAN_INTERVAL):
        yield


@contextmanager
def dispatchers():
    stop = threading.Event()
    thread = threading.Thread(target=_dispatch, args=(stop,), name="conformance-dispatchers")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(15)
        assert not thread.is_alive(), "the dispatchers did not stop"


def _dispatch(stop):
    try:
        dispatching.run_on_every_shard(stop)
    finally:
        connections.close_all()


class Runs:
    """What the work recorded: one row per run (tests/testapp/conformance.py)."""

    def of(self, kind, key) -> list:
        return [row for row in self.all(kind) if row[0] == key]

    def all(self, kind=None) -> list:
        """(key, pid, started_at) of every run (of `kind`), oldest first."""
        with connection.cursor() as cursor:
            cursor.execute("SELECT key, pid, started_at FROM timeouts_test_conformance "
                           "WHERE %s IS NULL OR kind = %s ORDER BY started_at", [kind, kind])
            return cursor.fetchall()

    def keys(self, kind) -> list:
        return [key for key, *_ in self.all(kind.name)]


@pytest.fixture
def kinds():
    """Every kind of work: each test runs them side by side, in one worker, as a deployment does."""
    return list(KINDS.values())


@pytest.fixture
def runs(placed):
    return Runs()

