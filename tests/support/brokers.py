"""RabbitMQ for the tests: a virtual host of its own for each test, and the test process's Celery app
pointed at it.

The suite's broker is Redis (TIMEOUTS_TEST_BROKER_URL). The tests whose behaviour depends on the
broker (publishing with confirms, routing to a named queue, ETA headroom, redelivery of a dead
worker's messages, a message waiting with no worker) run a second time on RabbitMQ through the
`rabbitmq` fixture, which a test module installs under the name the system tests ask for:

    from tests.support.brokers import rabbitmq as broker  # noqa: F401  (this module's tests: RabbitMQ)

It creates a virtual host (rabbitmqctl add_vhost; deleted afterwards, with its queues), points the
Celery app of this process at it (publishing, `app.control.ping`) and Django's CELERY_BROKER_URL
with it (`tests.support.processes.django_env()` hands that to every worker and dispatcher it starts), and
yields an object with the `broker` fixture's one method, `flushdb()` (a no-op: the virtual host is
new). Publisher confirms are on, as `timeouts.celery.setup()` turns them on for RabbitMQ.

`drop_connections(broker)` cuts every client of the suite's Redis broker off, as a network failure
would.

RabbitMQ is found at TIMEOUTS_TEST_RABBITMQ_URL (default amqp://guest:guest@127.0.0.1:5672, the
user that gets the rights on the virtual host); without it, or without `rabbitmqctl`, the tests are
skipped with the reason.
"""

import os
import shutil
import subprocess
import uuid
from contextlib import contextmanager
from urllib.parse import urlsplit

import kombu.pools
import pytest

RABBITMQ_URL = os.environ.get("TIMEOUTS_TEST_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672")
RABBITMQCTL = shutil.which("rabbitmqctl") or "/usr/sbin/rabbitmqctl"


def rabbitmq_missing() -> str | None:
    """Why RabbitMQ cannot be used here, or None."""
    from kombu import Connection

    if not os.path.exists(RABBITMQCTL):
        return "needs rabbitmqctl (RabbitMQ's command line) to create a virtual host"
    try:
        with Connection(f"{RABBITMQ_URL}//", connect_timeout=2) as conn:
            conn.ensure_connection(max_retries=1)
    except Exception as exc:  # noqa: BLE001  any failure means: no RabbitMQ for the tests
        return f"needs RabbitMQ at {RABBITMQ_URL} ({exc!r})"
    return None


def rabbitmqctl(*args, node=None, env=None, timeout=60):
    command = [RABBITMQCTL, *(["-n", node] if node else []), "-q", *args]
    return subprocess.run(command, check=True, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


class VirtualHost:
    """A RabbitMQ virtual host of its own, deleted (queues and messages with it) at exit."""

    def __init__(self, base_url=RABBITMQ_URL, *, prefix="timeouts-test", node=None, env=None):
        self.base_url, self.node, self.env = base_url.rstrip("/"), node, env
        self.name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        self.user = urlsplit(self.base_url).username or "guest"

    @property
    def url(self) -> str:
        return f"{self.base_url}/{self.name}"

    def __enter__(self):
        rabbitmqctl("add_vhost", self.name, node=self.node, env=self.env)
        try:
            rabbitmqctl("set_permissions", "-p", self.name, self.user, ".*", ".*", ".*", node=self.node, env=self.env)
        except BaseException:
            self.delete()
            raise
        return self

    def __exit__(self, *exc_info):
        self.delete()

    def delete(self):
        rabbitmqctl("delete_vhost", self.name, node=self.node, env=self.env)


def reset_connections(app):
    """Drop the app's broker connections, so the next use connects to its broker URL as it is now.
    The pools live in kombu's registry, keyed by broker URL: closed but left there, a pool would be
    handed back, closed, the next time the app asks for a connection to the same URL."""
    kombu.pools.reset()
    app._pool = None
    app.amqp._producer_pool = None


@contextmanager
def celery_on(url, monkeypatch):
    """This process's Celery app, and the children `tests.support.processes.django_env()` starts, on `url`."""
    from django.conf import settings

    from project.celery import app
    from project.settings import broker_transport_options

    # Celery reads CELERY_BROKER_URL from the environment before its own setting (tests/settings.py
    # pins it to the Redis test broker): both must change.
    monkeypatch.setenv("CELERY_BROKER_URL", url)
    monkeypatch.setattr(settings, "CELERY_BROKER_URL", url)
    previous = app.conf.broker_url, app.conf.broker_transport_options
    reset_connections(app)
    app.conf.broker_url, app.conf.broker_transport_options = url, broker_transport_options(url)
    try:
        yield app
    finally:
        reset_connections(app)
        app.conf.broker_url, app.conf.broker_transport_options = previous


class _Fresh:
    """The `broker` fixture's interface on a virtual host that was just created."""

    def __init__(self, vhost):
        self.url, self.vhost = vhost.url, vhost.name

    def flushdb(self):
        return True


def drop_connections(broker):
    """Close the broker's connections to every client on the test's Redis database, as a network
    failure would: the worker and the dispatcher reconnect. Redis only (CLIENT KILL takes
    milliseconds, where rabbitmqctl takes a second to start)."""
    database = broker.connection_pool.connection_kwargs.get("db", 0)
    own = broker.client_id()
    for client in broker.client_list():
        if int(client["db"]) == database and int(client["id"]) != own:
            broker.client_kill_filter(_id=client["id"])


@pytest.fixture
def rabbitmq(monkeypatch):
    """A new RabbitMQ virtual host, this process's Celery app and its children on it."""
    missing = rabbitmq_missing()
    if missing:
        pytest.skip(missing)
    with VirtualHost() as vhost, celery_on(vhost.url, monkeypatch) as app:
        assert app.conf.broker_transport_options.get("confirm_publish") is True
        yield _Fresh(vhost)
