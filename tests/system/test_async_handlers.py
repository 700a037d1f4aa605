"""`async def` handlers on a real Celery worker: awaited to their end, and failing, retrying and
going DEAD exactly as a plain function's."""

import pytest

from timeouts.dispatch.scan import scan
from timeouts.models import TimeoutTask

from .test_celery import scan_until

Status = TimeoutTask.Status
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def reload(task):
    return TimeoutTask.objects.get(job_id=task.job_id, action_time=task.action_time)


@pytest.mark.timeout(90)
def test_an_async_handler_runs_its_whole_body_before_done(worker, starts):
    tasks = [TimeoutTask.objects.schedule("test.async", i, delay=-1) for i in range(3)]
    # Settled: DONE, or failed once (its error then shows in the assertion below).
    scan_until(lambda: all(t.status == Status.DONE or t.last_error for t in map(reload, tasks)), 60,
               "the async tasks to finish")
    assert [(reload(task).status, reload(task).last_error) for task in tasks] == [(Status.DONE, "")] * 3
    assert sorted((job_id, attempt) for job_id, attempt, *_ in starts.all()) == [(task.job_id, 1) for task in tasks]


@pytest.mark.timeout(90)
def test_a_raising_async_handler_is_retried_then_dead_with_its_traceback(worker, starts):
    task = TimeoutTask.objects.schedule("test.async_fail", "x", delay=-1)
    scan()
    scan_until(lambda: reload(task).status in (Status.DONE, Status.DEAD), 60, "the task to end")
    dead = reload(task)
    assert (dead.status, dead.attempts) == (Status.DEAD, 2) and dead.finished_at is not None
    assert [attempt for _, attempt, *_ in starts.all()] == [1, 2]
    assert dead.last_error.startswith("Traceback (most recent call last):")
    assert "in always_fail_async" in dead.last_error
    assert dead.last_error.rstrip().endswith("RuntimeError: failing on purpose in a coroutine (attempt 2)")
