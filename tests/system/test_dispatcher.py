"""The low-latency dispatcher on a real PostgreSQL, a real broker and real Celery workers: tasks
start on time without any scan, notifications wake it, several dispatchers and the scan share the
work without a task starting twice, and waiting for far-away tasks costs (almost) nothing.

Dispatchers run either as `manage.py timeouts_dispatcher` processes, or in a thread of the test
process when a test needs to read its counters (`Dispatcher.stats`)."""

import sys
import threading
import time
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import psutil
import pytest
from django.db import connection, transaction

from tests.support import processes
from timeouts.dispatch.dispatcher import Dispatcher
from timeouts.dispatch.listener import APPLICATION_NAME
from timeouts.dispatch.scan import scan
from timeouts.models import TimeoutTask
from timeouts.store.queries import QUERIES

Status = TimeoutTask.Status
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ON_TIME = 1.0  # seconds: the most a start may lag its action_time in these tests


def schedule(biz_id, **when):
    return TimeoutTask.objects.schedule("test.record", biz_id, **when)


def dispatcher_backends(cursor_source=connection) -> list[int]:
    """Backend pids of the dispatchers' LISTEN connections to the current database."""
    with cursor_source.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s AND datname = current_database()",
                       [APPLICATION_NAME])
        return sorted(pid for (pid,) in cursor.fetchall())


@contextmanager
def dispatcher_process(name="dispatcher", *args, env=None, backends=dispatcher_backends):
    """`manage.py timeouts_dispatcher` as a real process; yields it once its connection is up."""
    before = set(backends())
    process = processes.spawn([sys.executable, "manage.py", "timeouts_dispatcher", *args],
                              env=env or processes.django_env(TIMEOUTS_LOG_LEVEL="DEBUG"), log_name=name)
    try:
        processes.wait_for(lambda: set(backends()) - before or process.poll() is not None, 30,
                           message=f"{name} to connect")
        assert process.poll() is None, f"{name} exited with {process.returncode}"
        yield process
    finally:
        processes.stop(process)


@contextmanager
def dispatcher_thread(**options):
    """A Dispatcher in a thread of this process, so the test can read its counters."""
    dispatcher = Dispatcher(**options)
    thread = threading.Thread(target=dispatcher.run, name="test-dispatcher")
    thread.start()
    try:
        assert dispatcher.stats.wait_for(lambda s: s.reads >= 1, 10), "the dispatcher never read the deadline"
        yield dispatcher
    finally:
        dispatcher.stop.set()
        thread.join(10)
        assert not thread.is_alive()


def lateness(rows):
    return [(started_at - action_time).total_seconds() for _, _, action_time, started_at in rows]


def done(n):
    return lambda: TimeoutTask.objects.filter(status=Status.DONE).count() >= n


@pytest.mark.timeout(60)
def test_a_task_due_in_200_ms_starts_on_time_without_any_scan(worker, starts):
    with dispatcher_process():
        task = schedule("soon", delay=0.2)
        processes.wait_for(lambda: starts.count() == 1, 10, message="the task to start")
    [row] = starts.all()
    assert row[0] == task.job_id
    [late] = lateness([row])
    print(f"lateness: {late * 1000:.1f} ms")
    assert 0 <= late < ON_TIME


@pytest.mark.timeout(60)
def test_a_notified_earlier_deadline_wakes_a_sleeping_dispatcher(worker, starts):
    far = schedule("far", delay=30)
    # Reads the table only at start and then every 25 s: only the NOTIFY can bring the near task.
    with dispatcher_thread(keepalive_interval=25) as dispatcher:
        assert 25 < dispatcher.wake_at - time.monotonic() < 31, "it should be sleeping toward the far task"
        near = schedule("near", delay=0.3)
        processes.wait_for(lambda: starts.count() == 1, 10, message="the near task to start")
        stats = dispatcher.stats.snapshot()
    [row] = starts.all()
    assert row[0] == near.job_id
    assert 0 <= lateness([row])[0] < ON_TIME
    assert stats["notifications"] >= 1 and stats["claimed"] == 1
    assert TimeoutTask.objects.get(job_id=far.job_id).status == Status.PENDING


@pytest.mark.timeout(60)
def test_a_rolled_back_schedule_never_notifies_and_never_runs(worker, starts):
    with dispatcher_thread(keepalive_interval=25) as dispatcher:
        with pytest.raises(RuntimeError), transaction.atomic():
            schedule("rolled-back", delay=0.2)
            raise RuntimeError
        marker = schedule("marker", delay=0.5)  # notifications arrive in commit order
        processes.wait_for(done(1), 10, message="the committed task")
        assert dispatcher.stats.notifications == 1
    assert [r[0] for r in starts.all()] == [marker.job_id]


@pytest.mark.timeout(540)
def test_thousands_of_tasks_two_dispatchers_and_the_scan_start_each_handler_once(worker, starts):
    # Due at one instant: the claimers race over every claim of the backlog (tests/reliability's
    # claim race does so at five times the size, with backpressure).
    count = 3_000
    errors = []
    stop = threading.Event()

    def keep_scanning():
        try:
            while not stop.is_set():
                scan(max_seconds=1)
                stop.wait(0.2)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    with dispatcher_process("dispatcher-a"), dispatcher_process("dispatcher-b"):
        at = datetime.now(UTC) + timedelta(seconds=2)
        TimeoutTask.objects.bulk_schedule([{"biz_type": "test.record", "biz_id": i, "at": at} for i in range(count)])
        scanner = threading.Thread(target=keep_scanning)
        scanner.start()
        try:
            processes.wait_for(done(count), 480, interval=0.5, message=f"{count} tasks done")
        finally:
            stop.set()
            scanner.join(30)
    assert not errors
    with connection.cursor() as cursor:
        cursor.execute("""SELECT count(*), count(DISTINCT job_id), count(*) FILTER (WHERE started_at < action_time),
                                 percentile_cont(0.5) WITHIN GROUP (ORDER BY started_at - action_time)
                          FROM timeouts_test_start""")
        total, distinct, early, median = cursor.fetchone()
    print(f"median lateness of {count}: {median}")
    assert (total, distinct, early) == (count, count, 0)


def _far_away_tasks():
    now = datetime.now(UTC)
    TimeoutTask.objects.bulk_schedule(
        [{"biz_type": "test.record", "biz_id": i, "at": now + timedelta(minutes=30, seconds=i * 0.18)}
         for i in range(10_000)]
    )


@pytest.mark.timeout(60)
def test_waiting_for_far_away_tasks_costs_almost_no_queries():
    _far_away_tasks()
    with dispatcher_thread() as dispatcher:
        before, started = dispatcher.stats.snapshot(), time.monotonic()
        time.sleep(5)  # the measurement window: nothing is due, nothing should happen
        after, elapsed = dispatcher.stats.snapshot(), time.monotonic() - started
    queries = after["queries"] - before["queries"]
    print(f"idle: {queries / elapsed:.2f} queries/s")
    assert after["wakeups"] == 0 and queries <= elapsed  # at most one query a second


@pytest.mark.timeout(60)
def test_waiting_for_far_away_tasks_costs_almost_no_cpu():
    # Measured on a dispatcher process of its own, as deployed: a thread of this test process would be
    # charged for what the process carries from other tests (its garbage collections, its threads).
    _far_away_tasks()
    with dispatcher_process("dispatcher-idle") as process:
        dispatcher = psutil.Process(process.pid)
        _wait_until_settled(dispatcher)  # its start-up, then its first read of the deadline
        cpu_before, started = sum(dispatcher.cpu_times()[:2]), time.monotonic()
        time.sleep(5)  # the measurement window: nothing is due, nothing should happen
        cpu = (sum(dispatcher.cpu_times()[:2]) - cpu_before) / (time.monotonic() - started)
    print(f"idle: {cpu:.3%} CPU")
    assert cpu < 0.01


def _wait_until_settled(process, quiet=0.5, timeout=20):
    """Until `process` has used no CPU for `quiet` seconds. A dispatcher's start-up goes on after its
    first connection (imports, the broker's, LISTEN, the first read of the deadline), and on a busy
    machine past any fixed delay: measured, it would be charged to the idle wait."""
    deadline, last, still_since = time.monotonic() + timeout, None, time.monotonic()
    while time.monotonic() < deadline:
        used = sum(process.cpu_times()[:2])
        if used != last:
            last, still_since = used, time.monotonic()
        elif time.monotonic() - still_since >= quiet:
            return
        time.sleep(0.05)
    raise AssertionError(f"the dispatcher never stopped using CPU for {quiet} s in {timeout} s")


@pytest.mark.timeout(90)
def test_a_backlog_held_back_by_backpressure_does_not_spin_the_dispatcher(worker, starts, settings):
    """A backlog larger than MAX_DISPATCHED: each start frees room for one more claim. The dispatcher
    must wait a little and claim what freed up in chunks, not chase every start with a claim of its
    own: such a hot loop of tiny claims takes a CPU of the database from the workers it waits for."""
    settings.TIMEOUTS = {**settings.TIMEOUTS, "MAX_DISPATCHED": 50}
    now = datetime.now(UTC)
    TimeoutTask.objects.bulk_schedule(
        [{"biz_type": "test.record", "biz_id": i, "at": now - timedelta(seconds=1)} for i in range(3000)])
    with dispatcher_thread() as dispatcher:
        assert dispatcher.stats.wait_for(lambda s: s.claimed >= 200, 30)
        before, started = dispatcher.stats.snapshot(), time.monotonic()
        time.sleep(3)
        after, elapsed = dispatcher.stats.snapshot(), time.monotonic() - started
    wakeups = after["wakeups"] - before["wakeups"]
    claimed = after["claimed"] - before["claimed"]
    print(f"held back: {wakeups / elapsed:.1f} claims/s, {claimed / max(wakeups, 1):.1f} tasks per claim")
    assert claimed > 0  # the backlog moved
    # Backing off 50-100 ms between claims makes at most ~13 a second; chasing each start would make
    # more, and far more when the database is the busy one.
    assert wakeups / elapsed <= 15


@pytest.mark.timeout(60)
def test_the_nearest_deadline_is_read_from_the_due_index_of_every_partition():
    now = datetime.now(UTC)
    TimeoutTask.objects.bulk_schedule(
        [{"biz_type": "test.record", "biz_id": i, "at": now + timedelta(hours=i % 72)} for i in range(3000)]
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE timeouts_task")
        cursor.execute("SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = 'timeouts_task'::regclass")
        partitions = {name for (name,) in cursor.fetchall()}
        cursor.execute("SELECT inhrelid::regclass::text FROM pg_inherits "
                       "WHERE inhparent = 'timeouts_task_due'::regclass")
        due_indexes = {name for (name,) in cursor.fetchall()}
        cursor.execute("EXPLAIN (FORMAT JSON) " + QUERIES["nearest_deadline"])
        [[plan]] = cursor.fetchone()
    scans = {}
    _collect_scans(plan["Plan"], scans)
    assert "timeouts_limits" in scans  # the smallest lateness policy that ends tasks, read alongside
    del scans["timeouts_limits"]
    assert partitions and set(scans) == partitions, plan
    assert all(kind in ("Index Only Scan", "Index Scan") and index in due_indexes
               for kind, index in scans.values()), scans


def _collect_scans(node, scans):
    if "Relation Name" in node:
        scans[node["Relation Name"]] = (node["Node Type"], node.get("Index Name"))
    for child in node.get("Plans", []):
        _collect_scans(child, scans)


@pytest.mark.timeout(90)
def test_inside_a_worker_the_dispatcher_is_one_thread_of_the_main_process(broker, starts, tmp_path):
    # A settings module that turns the option on; TimeoutsConfig.ready() connects the signals.
    (tmp_path / "in_worker_settings.py").write_text(
        "from tests.settings import *  # noqa\n"
        "TIMEOUTS = {**TIMEOUTS, 'DISPATCHER_IN_WORKER': True}  # noqa\n"
    )
    env = processes.django_env(DJANGO_SETTINGS_MODULE="in_worker_settings",
                               PYTHONPATH=f"{processes.ROOT}:{tmp_path}", TIMEOUTS_LOG_LEVEL="DEBUG")
    broker.flushdb()
    with processes.running_worker(env=env, name="worker-with-dispatcher") as worker:
        [backend] = processes.wait_for(dispatcher_backends, 30, message="the in-worker dispatcher")
        task = schedule("in-worker", delay=0.3)
        processes.wait_for(lambda: starts.count() == 1, 10, message="the task to start")
        [row] = starts.all()
        assert row[0] == task.job_id and 0 <= lateness([row])[0] < ON_TIME
        # One dispatcher, and its connection belongs to the main process, not to a pool child.
        assert dispatcher_backends() == [backend]
        with connection.cursor() as cursor:
            cursor.execute("SELECT client_port FROM pg_stat_activity WHERE pid = %s", [backend])
            [port] = cursor.fetchone()
        main = psutil.Process(worker.pid)
        assert port in {c.laddr.port for c in main.net_connections("tcp")}
        assert all(port not in {c.laddr.port for c in child.net_connections("tcp")} for child in main.children())
    processes.wait_for(lambda: not dispatcher_backends(), 10, message="the dispatcher to disconnect")
