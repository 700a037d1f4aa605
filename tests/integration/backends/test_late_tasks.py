"""A task of Django's tasks framework under a lateness policy (set_limits() on its queue's
biz_type): it goes through the same compare-and-set as any timeout, or ends while it waits as any
timeout does, and its result says why it did not run."""

from datetime import UTC, datetime, timedelta

import pytest

import timeouts
from tests.integration.backends.test_backend import rows, run_due, tables  # noqa: F401  (tables: a fixture)
from tests.support.isolation import no_limits  # noqa: F401  (a fixture)
from tests.testapp import django_tasks as tasks
from timeouts.backends import StartedLate
from timeouts.backends.compat import TaskResultStatus
from timeouts.dispatch.late_sweep import end_late

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60), pytest.mark.usefixtures("no_limits")]


@pytest.mark.parametrize("on_late", ["skip", "dead"])
def test_a_task_that_starts_too_late_fails_with_started_late(on_late):
    result = tasks.add.using(run_after=datetime.now(UTC) - timedelta(minutes=1)).enqueue(1, 2)
    [row] = rows()
    timeouts.set_limits(row.biz_type, max_lateness=timedelta(seconds=5), on_late=on_late)
    assert run_due() == ["skipped late" if on_late == "skip" else "dead late"]
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert [error.exception_class for error in result.errors] == [StartedLate]
    assert result.errors[0].traceback.endswith(f"over max_lateness 5 s (on_late={on_late})")


def test_a_task_on_time_runs_under_the_policy():
    result = tasks.add.enqueue(1, 2)
    [row] = rows()
    timeouts.set_limits(row.biz_type, max_lateness=timedelta(minutes=5), on_late="skip")
    assert run_due() == ["done"]
    assert tasks.add.get_result(result.id).return_value == 3


@pytest.mark.parametrize("on_late", ["skip", "dead"])
def test_a_task_ended_while_it_waits_fails_with_started_late_too(on_late):
    result = tasks.add.using(run_after=datetime.now(UTC) - timedelta(minutes=1)).enqueue(1, 2)
    [row] = rows()
    timeouts.set_limits(row.biz_type, max_lateness=timedelta(seconds=5), on_late=on_late)
    assert end_late() == 1  # the dispatcher's sweep: never claimed
    assert run_due() == []
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert [error.exception_class for error in result.errors] == [StartedLate]
    assert result.errors[0].traceback.endswith(f"over max_lateness 5 s (on_late={on_late})")
