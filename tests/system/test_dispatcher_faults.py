"""The dispatcher under faults: its backend killed, the database restarted, a connection that goes
silent, a broker that stops answering, and SIGTERM in the middle of dispatching."""

import signal
import socket
import threading
import time
from contextlib import suppress
from datetime import UTC, datetime, timedelta
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from django.conf import settings
from django.db import connection

from tests.reliability.clusters import ThrowawayPostgres, postgres_available
from tests.support import processes
from tests.support.broker_messages import queue_length, queued_messages
from tests.system.test_dispatcher import (
    ON_TIME,
    dispatcher_backends,
    dispatcher_process,
    dispatcher_thread,
    lateness,
    schedule,
)
from tests.testapp.recorder import TABLE_SQL
from timeouts.conf import get_settings
from timeouts.dispatch.listener import APPLICATION_NAME, Listener, connection_params
from timeouts.models import TimeoutTask
from timeouts.store.queries import fetch_one
from timeouts.store.scheduling import prepare

Status = TimeoutTask.Status
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.mark.timeout(60)
def test_a_killed_listen_backend_is_replaced_and_later_tasks_start_on_time(worker, starts):
    with dispatcher_process("dispatcher-killed"):
        [old] = dispatcher_backends()
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [old])
        processes.wait_for(lambda: [pid for pid in dispatcher_backends() if pid != old], 15, message="a reconnect")
        task = schedule("after-kill", delay=0.3)
        processes.wait_for(lambda: starts.count() == 1, 10, message="the task to start")
    [row] = starts.all()
    assert row[0] == task.job_id and 0 <= lateness([row])[0] < ON_TIME


@pytest.mark.timeout(60)
def test_a_silent_connection_is_detected_by_the_keepalive_and_replaced(broker):
    db = connection.settings_dict
    with FreezableProxy((db["HOST"] or "127.0.0.1", int(db["PORT"] or 5432))) as proxy:
        params = connection_params(query_timeout=1.0, host="127.0.0.1", port=proxy.port)
        listener = Listener(get_settings().NOTIFY_CHANNEL, params, query_timeout=1.0)
        with dispatcher_thread(listener=listener, keepalive_interval=1.0) as dispatcher:
            proxy.freeze()  # the connection stays open, but nothing comes back through it any more
            assert dispatcher.stats.wait_for(lambda s: s.reconnects >= 1, 10), dispatcher.stats.snapshot()
            task = schedule("after-silence", delay=0.3)
            processes.wait_for(lambda: TimeoutTask.objects.get(job_id=task.job_id).status == Status.DISPATCHED, 10,
                               message="the task to be published")
    broker.flushdb()


@pytest.mark.timeout(90)
def test_a_silent_broker_cannot_hang_the_dispatcher_and_no_task_starts_twice(worker, broker, starts):
    broker_url = urlsplit(settings.CELERY_BROKER_URL)
    with FreezableProxy((broker_url.hostname, broker_url.port or 6379)) as proxy:
        proxy.freeze(new_connections=True)
        env = processes.django_env(TIMEOUTS_LOG_LEVEL="DEBUG", TIMEOUTS_TEST_BROKER_URL=urlunsplit(
            broker_url._replace(netloc=f"127.0.0.1:{proxy.port}")))
        with dispatcher_process("dispatcher-silent-broker", "--publish-timeout", "1", env=env):
            task = schedule("silent-broker", delay=0.2)
            # Claimed, not taken by the broker in time, released: PENDING again, with a dispatched_at.
            processes.wait_for(lambda: TimeoutTask.objects.filter(job_id=task.job_id, status=Status.PENDING,
                                                                  dispatched_at__isnull=False).exists(),
                               15, message="the unpublished claim to be released")
            proxy.thaw()  # the stuck sends go through now too: duplicate messages for the worker
            processes.wait_for(lambda: TimeoutTask.objects.get(job_id=task.job_id).status == Status.DONE, 30,
                               message="the task to run")
            processes.wait_for(lambda: not queue_length(broker) and not broker.hlen("unacked"), 15,
                               message="every message to be consumed")
    assert [row[0] for row in starts.all()] == [task.job_id]


@pytest.mark.timeout(60)
def test_sigterm_stops_promptly_and_leaves_no_claim_without_a_message(broker):
    broker.flushdb()
    at = datetime.now(UTC) + timedelta(seconds=1)
    TimeoutTask.objects.bulk_schedule([{"biz_type": "test.record", "biz_id": i, "at": at} for i in range(5000)])
    with dispatcher_process("dispatcher-sigterm", "--batch-size", "50") as process:
        processes.wait_for(lambda: TimeoutTask.objects.filter(status=Status.DISPATCHED).exists(), 20, interval=0.01,
                           message="dispatching to begin")
        process.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        process.wait(10)
        stopped_in = time.monotonic() - sent
    assert process.returncode == 0 and stopped_in < 5
    dispatched = set(TimeoutTask.objects.filter(status=Status.DISPATCHED).values_list("job_id", flat=True))
    assert dispatched and dispatched == published_job_ids(broker)
    assert TimeoutTask.objects.filter(status=Status.PENDING).count() + len(dispatched) == 5000
    broker.flushdb()


def published_job_ids(broker) -> set[int]:
    """The job ids of the `timeouts.run` and `timeouts.run_batch` messages waiting in the broker (no
    worker runs here)."""
    ids = [job_id for _name, job_ids, _limit in queued_messages(broker) for job_id in job_ids]
    assert len(ids) == len(set(ids)), "a task was published twice"
    return set(ids)


@pytest.mark.timeout(240)
def test_a_database_restart_ends_with_the_dispatcher_reconnected_and_tasks_starting(broker, throwaway_database):
    url, restart = throwaway_database
    env = processes.django_env(DATABASE_URL=url, TIMEOUTS_LOG_LEVEL="DEBUG")
    broker.flushdb()
    # One pool process, so the warm-up below certainly reaches the one whose connections died.
    with processes.running_worker(env=env, name="worker-restart", concurrency=1):
        with dispatcher_process("dispatcher-restart", env=env, backends=lambda: _backends(url)):
            assert _run_one(url, "before-restart") < ON_TIME
            [old] = _backends(url)
            restart()
            processes.wait_for(lambda: _backends(url), 60, interval=0.2, message="the dispatcher to reconnect")
            # The pool process's connections died with the server too: the test handler's recorder
            # fails on its next start, and the task is retried after a backoff. That is the worker's
            # business; warm it up so that the task below times the dispatcher alone.
            _run_one(url, "after-restart-warm-up", timeout=30)
            assert _run_one(url, "after-restart") < ON_TIME
            assert _backends(url) != [old]


def _backends(url) -> list[int]:
    try:
        with psycopg.connect(url, connect_timeout=2) as conn:
            rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s", [APPLICATION_NAME])
            return sorted(pid for (pid,) in rows)
    except psycopg.OperationalError:
        return []


def _run_one(url, biz_id, timeout=10) -> float:
    """Schedule a task due in 0.3 s through the real write path (with its NOTIFY) on the database at
    `url`; wait for its handler to finish; return its lateness in seconds."""
    with psycopg.connect(url, autocommit=True) as conn:
        job_id = fetch_one("insert_task", prepare("test.record", biz_id, delay=0.3).params(), using=conn)["job_id"]

        def finished():
            row = conn.execute("SELECT status FROM timeouts_task WHERE job_id = %s", [job_id]).fetchone()
            return row[0] == Status.DONE

        processes.wait_for(finished, timeout, message=f"task {biz_id} to finish")
        rows = conn.execute("SELECT job_id, attempt, action_time, started_at FROM timeouts_test_start "
                            "WHERE job_id = %s", [job_id]).fetchall()
    return max(lateness(rows))


@pytest.fixture
def throwaway_database():
    """A PostgreSQL cluster of its own (initdb in a temp dir, run as the postgres user, on a free
    port), migrated; yields (url, restart) and always stops the cluster and deletes the dir."""
    if not postgres_available():
        pytest.skip("needs root (to run PostgreSQL as the postgres user) and PostgreSQL 15's binaries")
    with ThrowawayPostgres(extra_sql=[TABLE_SQL]) as cluster:
        yield cluster.url, cluster.restart


class FreezableProxy:
    """A TCP relay whose connections can be frozen: it still accepts bytes (so the peers' kernels see
    them acknowledged) but passes nothing on, like a peer gone silent behind a half-open connection."""

    def __init__(self, target):
        self.target = target
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.lock = threading.Lock()
        self.gates, self.sockets = [], []  # a gate per connection: set while relaying
        self.freeze_new = False
        threading.Thread(target=self._accept, daemon=True).start()

    def freeze(self, *, new_connections=False):
        """Freeze the open connections (and those accepted later too, if `new_connections`)."""
        with self.lock:
            self.freeze_new = new_connections
            for gate in self.gates:
                gate.clear()

    def thaw(self):
        with self.lock:
            self.freeze_new = False
            for gate in self.gates:
                gate.set()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.server.close()
        self.thaw()
        with self.lock:
            for sock in self.sockets:
                sock.close()

    def _accept(self):
        while True:
            try:
                client, _ = self.server.accept()
                upstream = socket.create_connection(self.target)
            except OSError:
                return
            gate = threading.Event()
            with self.lock:
                if not self.freeze_new:
                    gate.set()
                self.gates.append(gate)
                self.sockets += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._relay, args=(source, sink, gate), daemon=True).start()

    @staticmethod
    def _relay(source, sink, gate):
        try:
            while data := source.recv(65536):
                gate.wait()
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
