"""timeouts.testing.run_due with three shards (tests/support/shards.py), inside the test's
transaction on each of them: every shard's due tasks run, and what a run schedules on another
shard runs in the same call."""

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

import timeouts
from tests.support.shards import ALIASES, key_on, three_shards  # noqa: F401 (an autouse fixture)
from tests.testapp import run_due_work as work
from timeouts.backends.compat import TaskResultStatus
from timeouts.models import TimeoutTask
from timeouts.testing import run_due

Status = TimeoutTask.Status
pytestmark = [pytest.mark.django_db(databases=ALIASES), pytest.mark.timeout(60)]


@pytest.fixture(autouse=True)
def runs():
    work.RUNS.clear()
    yield work.RUNS
    work.RUNS.clear()


def prefix() -> str:
    return f"shard-{uuid.uuid4().hex[:8]}"


def test_every_shards_due_tasks_run():
    tasks = [timeouts.schedule("rundue.note", key_on(alias, prefix(), "rundue.note"), delay=0) for alias in ALIASES]
    assert [task._state.db for task in tasks] == ALIASES

    assert run_due() == 3
    assert {TimeoutTask.objects.using(task._state.db).get(job_id=task.job_id).status for task in tasks} == {Status.DONE}


def test_what_a_run_schedules_on_another_shard_runs_in_the_same_call():
    # The first shard is visited first: the task scheduled there comes due after its turn.
    first, then = key_on("shard_c", prefix(), "rundue.follow"), key_on("default", prefix(), "rundue.note")
    timeouts.schedule("rundue.follow", first, delay=0, attribute={"next": then, "delay": 0})

    assert run_due() == 2
    assert work.RUNS == [("rundue.follow", first, 1), ("rundue.note", then, 1)]
    [done] = TimeoutTask.objects.using("default").filter(biz_id=then)
    assert done.status == Status.DONE


def test_calls_and_django_tasks_run_on_the_shard_that_holds_them():
    task_ids = [key_on(alias, prefix(), "celery:any") for alias in ALIASES]  # a call's shard: its task_id's
    calls = [work.note_call.apply_async((task_id,), task_id=task_id, countdown=60) for task_id in task_ids]
    results = [work.close_order_task.enqueue(0) for _ in range(6)]
    assert {alias for alias in ALIASES for call in calls
            if TimeoutTask.objects.using(alias).filter(biz_id=call.id).exists()} == set(ALIASES)

    assert run_due(until=timezone.now() + timedelta(minutes=2)) == len(calls) + len(results)
    assert sorted(run[1] for run in work.RUNS if run[0] == work.note_call.name) == sorted(task_ids)
    assert {work.close_order_task.get_result(result.id).status for result in results} == {TaskResultStatus.SUCCESSFUL}
