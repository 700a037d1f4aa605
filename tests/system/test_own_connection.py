"""A worker runs timeouts' statements on a connection of its own, kept across messages whatever
CONN_MAX_AGE and CELERY_DB_REUSE_MAX say, and leaves Django's connection to the handlers."""

from datetime import timedelta

import pytest
from django.db import connection

from tests.support import processes
from tests.testapp import recorder
from tests.testapp.recorder import CONNECTIONS_TABLE_SQL
from timeouts import tasks
from timeouts.dispatch.claiming import claim_due
from timeouts.dispatch.scan import scan
from timeouts.models import TimeoutTask

Status = TimeoutTask.Status
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def recorded():
    """The (job_id, timeouts_pid, orm_pid) rows that the test.connections handler records."""
    with connection.cursor() as cursor:
        cursor.execute(CONNECTIONS_TABLE_SQL)
        cursor.execute("TRUNCATE timeouts_test_connections")

    def rows():
        with connection.cursor() as cursor:
            cursor.execute("SELECT job_id, timeouts_pid, orm_pid FROM timeouts_test_connections ORDER BY job_id")
            return cursor.fetchall()

    yield rows
    recorder.close()  # an in-process handler opened it
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE timeouts_test_connections")


@pytest.fixture
def worker_with_django_defaults(broker):
    """A real prefork worker (2 processes) whose settings are Django's and Celery's defaults."""
    broker.flushdb()
    env = processes.django_env(DJANGO_SETTINGS_MODULE="tests.settings_defaults")
    with processes.running_worker(env=env, name="defaults-worker") as process:
        yield process


def run_through_the_worker(count, *, first="a"):
    """Schedule `count` test.connections tasks 0.2 s apart, scan (as beat would) until DONE. Tasks
    claimed together share a message (timeouts.run_batch), so most, not all, come alone."""
    now = TimeoutTask.objects.schedule("test.record", f"clock-{first}", delay=3600).created_at
    jobs = [TimeoutTask.objects.schedule("test.connections", f"{first}{i}", at=now + timedelta(seconds=0.5 + i / 5))
            for i in range(count)]

    def all_done():
        scan()
        return TimeoutTask.objects.filter(job_id__in=[j.job_id for j in jobs], status=Status.DONE).count() == count

    processes.wait_for(all_done, timeout=60, interval=0.05, message=f"{count} tasks done")
    return jobs


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_with_djangos_defaults_a_worker_keeps_its_own_connection_and_handlers_keep_djangos(
        worker_with_django_defaults, recorded):
    run_through_the_worker(12)
    rows = recorded()
    assert len(rows) == 12
    timeouts_pids, orm_pids = {r[1] for r in rows}, {r[2] for r in rows}
    assert len(timeouts_pids) <= 2  # one per pool process, kept across messages
    # Celery closed Django's connection after every message, as these settings ask.
    assert len(orm_pids) >= 6
    assert not timeouts_pids & orm_pids


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_worker_replaces_its_connection_when_the_server_ended_it(worker_with_django_defaults, recorded):
    run_through_the_worker(4, first="before")
    ended = {pid for _, pid, _ in recorded()}
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", [list(ended)])
    jobs = run_through_the_worker(4, first="after")
    after = [pid for job_id, pid, _ in recorded() if job_id in {j.job_id for j in jobs}]
    assert len(after) == 4 and not set(after) & ended
    assert TimeoutTask.objects.filter(status=Status.DONE, biz_type="test.connections").count() == 8


def test_an_eager_or_direct_call_runs_on_djangos_connection(recorded):
    job = TimeoutTask.objects.schedule("test.connections", "eager", delay=-1)
    [claim] = claim_due(10)
    assert tasks.run.apply(args=claim.message_args()).get() == "done"
    [(job_id, timeouts_pid, orm_pid)] = recorded()
    assert job_id == job.job_id and timeouts_pid == orm_pid == connection.connection.info.backend_pid
