"""Three shards with a real `timeouts_dispatcher` process and a real Celery worker: one dispatcher
process serves every shard, each task starts once and on time on its own shard, and a shard the
dispatcher cannot reach holds back only its own tasks, which start once it can."""

import itertools
import sys
import time
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connections

import timeouts
from tests.support import processes
from tests.support.broker_messages import queue_length
from tests.support.shards import ALIASES, key_on, three_shards  # noqa: F401 (an autouse fixture)
from timeouts.dispatch.listener import APPLICATION_NAME
from timeouts.models import TimeoutTask
from timeouts.storage import shards

Status = TimeoutTask.Status
pytestmark = [pytest.mark.django_db(transaction=True, databases=ALIASES), pytest.mark.slow, pytest.mark.timeout(120)]

ON_TIME = 1.0  # seconds: the most a start may lag its action_time here


def listening(alias) -> int:
    """How many dispatcher LISTEN connections the shard `alias` has."""
    with connections[alias].cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                       "AND datname = current_database()", [APPLICATION_NAME])
        return cursor.fetchone()[0]


@contextmanager
def dispatcher(*, reaching, **env):
    """`manage.py timeouts_dispatcher` as a process; yields once it listens on the shards `reaching`."""
    process = processes.spawn([sys.executable, "manage.py", "timeouts_dispatcher"],
                              env=processes.django_env(**env), log_name="dispatcher-shards")
    try:
        processes.wait_for(lambda: all(listening(alias) for alias in reaching) or process.poll() is not None, 30,
                           message="the dispatcher to listen on every shard")
        assert process.poll() is None, f"the dispatcher exited with {process.returncode}"
        yield process
    finally:
        processes.stop(process)


def spread(count, delay):
    """`count` tasks due after `delay` seconds, on the shards in turn; returns them by shard."""
    made = {alias: [] for alias in ALIASES}
    for n in itertools.count():
        biz_id = f"spread-{n}"
        alias = shards.place("test.record", biz_id).alias
        if len(made[alias]) < count // len(ALIASES):
            made[alias].append(timeouts.schedule("test.record", biz_id, delay=delay))
        if sum(map(len, made.values())) == count:
            return made


def lateness(starts, tasks) -> dict[int, float]:
    wanted = {task.job_id for task in tasks}
    return {job_id: (started_at - action_time).total_seconds()
            for job_id, _, action_time, started_at in starts.all() if job_id in wanted}


def test_one_dispatcher_process_starts_every_shards_tasks_once_and_on_time(worker, starts):
    with dispatcher(reaching=ALIASES):
        made = spread(30, delay=1.5)
        tasks = [task for shard_tasks in made.values() for task in shard_tasks]
        processes.wait_for(lambda: starts.count() >= 30, 20, message="every task to start")
        for alias, shard_tasks in made.items():
            assert TimeoutTask.objects.using(alias).filter(status=Status.DONE).count() == len(shard_tasks)
    late = lateness(starts, tasks)
    assert starts.count() == 30 and len(late) == 30  # each once
    assert 0 <= min(late.values()) and max(late.values()) < ON_TIME, late  # never early, on time


def test_a_shard_the_dispatcher_cannot_reach_holds_back_only_its_own_tasks(worker, starts):
    with dispatcher(reaching=["default", "shard_b"],
                    TIMEOUTS_TEST_SHARD_C_URL=f"postgres://postgres@127.0.0.1:{processes.free_port()}/gone"):
        made = spread(30, delay=1.5)
        reachable = made["default"] + made["shard_b"]
        processes.wait_for(lambda: starts.count() >= 20, 20, message="the reachable shards' tasks to start")
        late = lateness(starts, reachable)
        assert len(late) == 20 and max(late.values()) < ON_TIME, late
        assert TimeoutTask.objects.using("shard_c").filter(status=Status.PENDING).count() == 10
    with dispatcher(reaching=ALIASES):  # the shard is back: its tasks start, late, none lost
        processes.wait_for(lambda: starts.count() >= 30, 20, message="the held tasks to start")
    assert len(lateness(starts, made["shard_c"])) == 10 and starts.count() == 30


def test_a_true_cancel_racing_the_due_time_never_runs_on_any_shard(worker, starts):
    with dispatcher(reaching=ALIASES):
        made = spread(60, delay=1.0)
        tasks = [task for shard_tasks in made.values() for task in shard_tasks]
        time.sleep(0.95)  # the cancels meet the dispatcher's claims and the workers' starts
        cancelled = {task.job_id for task in tasks[::2] if task.cancel()}
        processes.wait_for(lambda: starts.count() >= 60 - len(cancelled), 20, message="the others to start")
        time.sleep(1.0)  # a start that should not have happened has had time to show
    started = set(lateness(starts, tasks))
    assert not started & cancelled
    assert started == {task.job_id for task in tasks} - cancelled


def test_durable_calls_and_django_tasks_run_once_from_their_shards(worker, starts):
    from tests.testapp import django_tasks
    from tests.testapp import tasks as celery_tasks
    from timeouts.backends.compat import TaskResultStatus

    with connections["default"].cursor() as cursor:
        for table in (celery_tasks.CALLS_TABLE_SQL, django_tasks.RUNS_TABLE_SQL, django_tasks.SIGNALS_TABLE_SQL):
            cursor.execute(table)
        cursor.execute("TRUNCATE timeouts_test_call")
    with dispatcher(reaching=ALIASES):
        calls = [celery_tasks.record.apply_async((n,), countdown=1.5) for n in range(30)]  # on every shard
        later = datetime.now(UTC) + timedelta(seconds=1.5)
        results = [django_tasks.add.using(run_after=later).enqueue(n, 1) for n in range(12)]
        assert {shards.hashed(call.id).alias for call in calls} == set(ALIASES)  # (2/3)**30: never missed

        def ran():
            with connections["default"].cursor() as cursor:
                cursor.execute("SELECT task_id FROM timeouts_test_call")
                return [task_id for (task_id,) in cursor.fetchall()]

        processes.wait_for(lambda: len(ran()) >= len(calls) and all(
            django_tasks.add.get_result(r.id).status == TaskResultStatus.SUCCESSFUL for r in results), 30,
            message="every call and task to run")
    assert sorted(ran()) == sorted(call.id for call in calls)  # each once
    for call in calls:
        row = TimeoutTask.objects.using(shards.hashed(call.id).alias).get(biz_id=call.id)
        assert row.status == Status.DONE
    assert [django_tasks.add.get_result(r.id).return_value for r in results] == [n + 1 for n in range(12)]
    django_tasks.close()


def in_flight_everywhere(biz_type) -> int:
    """Tasks of `biz_type` claimed or running on all the shards together, each read at once."""
    total = 0
    for alias in ALIASES:
        with connections[alias].cursor() as cursor:
            cursor.execute("SELECT count(*) FROM timeouts_task WHERE biz_type = %s AND status IN (%s, %s)",
                           [biz_type, Status.DISPATCHED, Status.RUNNING])
            total += cursor.fetchone()[0]
    return total


@pytest.mark.timeout(180)
def test_a_concurrency_limit_holds_across_the_shards_together(broker, starts):
    timeouts.set_limits("test.slow", concurrency=2)
    # test.slow sleeps on its first attempt: 1 s here. Three on each shard, due together; the
    # even parts of 2 over 3 shards leave the first shard none until the scan shares them out.
    at = datetime.now(UTC) + timedelta(seconds=1.5)
    made = []
    for n in itertools.count():
        biz_id = f"slow-{n}"
        if sum(shards.place("test.slow", key).alias == shards.place("test.slow", biz_id).alias for key in made) < 3:
            made.append(biz_id)
        if len(made) == 9:
            break
    TimeoutTask.objects.bulk_schedule([{"biz_type": "test.slow", "biz_id": biz_id, "attribute": {"sleep": 1.0},
                                        "at": at} for biz_id in made])
    most = 0
    with processes.running_worker(env=processes.django_env(), name="worker-shard-limits", concurrency=4), \
            processes.scanning(0.5), dispatcher(reaching=ALIASES):
        deadline = time.monotonic() + 60
        while starts.count() < 9 and time.monotonic() < deadline:
            most = max(most, in_flight_everywhere("test.slow"))
            time.sleep(0.01)
    assert starts.count() == 9, "every task started once"
    assert most == 2, "never more than the limit at once, on all the shards together"


def task_id_on(alias, prefix) -> str:
    """A Celery task_id whose stored calls live on `alias`."""
    return next(task_id for task_id in (f"{prefix}-{n}" for n in itertools.count())
                if shards.hashed(task_id).alias == alias)


def test_a_call_expired_when_claimed_ends_cancelled_on_its_own_shard(broker):
    from tests.testapp import tasks as celery_tasks

    broker.flushdb()
    calls = {alias: celery_tasks.record.apply_async((alias,), task_id=task_id_on(alias, "expired"), countdown=0.5,
                                                    expires=0.2) for alias in ALIASES}

    def status(alias):
        return TimeoutTask.objects.using(alias).get(biz_id=calls[alias].id).status

    with dispatcher(reaching=ALIASES):
        # No scan runs: a claim left DISPATCHED here would stay so (its lease recovered by no one).
        processes.wait_for(lambda: all(status(alias) == Status.CANCELLED for alias in ALIASES), 15,
                           message="every shard's expired call to end CANCELLED")
    for alias in ALIASES:
        row = TimeoutTask.objects.using(alias).get(biz_id=calls[alias].id)
        assert row.dispatched_at is not None and "expired" in row.last_error
    assert not queue_length(broker), "an expired call is never published"


def test_claims_the_broker_did_not_take_go_back_at_once_on_every_shard():
    made = {alias: timeouts.schedule("test.record", key_on(alias, "no-broker"), delay=0.5) for alias in ALIASES}

    def given_back(alias):
        # Claimed (it has a dispatched_at) and PENDING again, well before its lease (60 s) runs out.
        return TimeoutTask.objects.using(alias).filter(job_id=made[alias].job_id, status=Status.PENDING,
                                                      dispatched_at__isnull=False).exists()

    unreachable_broker = f"redis://127.0.0.1:{processes.free_port()}/0"
    with dispatcher(reaching=ALIASES, TIMEOUTS_TEST_BROKER_URL=unreachable_broker):
        processes.wait_for(lambda: all(given_back(alias) for alias in ALIASES), 15,
                           message="every shard's unpublished claim to go back to PENDING")
