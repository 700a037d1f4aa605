"""The sweep of late PENDING tasks across three shards: each shard's dispatcher sweeps its own
shard, by the policy stored there; the scan sweeps every shard."""

from datetime import UTC, datetime, timedelta

import pytest

import timeouts
from tests.support.shards import ALIASES, key_on, three_shards  # noqa: F401 (an autouse fixture)
from timeouts.dispatch.late_sweep import end_late
from timeouts.dispatch.scan import scan
from timeouts.models import TimeoutTask
from timeouts.store import worker_connection

Status = TimeoutTask.Status
pytestmark = [pytest.mark.django_db(transaction=True, databases=ALIASES), pytest.mark.timeout(60)]


def statuses(tasks):
    return {task._state.db: TimeoutTask.objects.using(task._state.db).get(job_id=task.job_id).status
            for task in tasks}


def test_each_shard_sweeps_its_own_and_the_scan_sweeps_them_all(broker):
    timeouts.set_limits("test.record", max_lateness=timedelta(seconds=5), on_late="skip")
    at = datetime.now(UTC) - timedelta(seconds=30)
    late = [timeouts.schedule("test.record", key_on(alias), at=at) for alias in ALIASES]
    assert [task._state.db for task in late] == ALIASES
    with worker_connection.shared("shard_b"):  # as the dispatcher of shard_b, on a connection to it
        assert end_late() == 1
    assert statuses(late) == {"default": Status.PENDING, "shard_b": Status.CANCELLED, "shard_c": Status.PENDING}
    assert scan() == 0
    assert set(statuses(late).values()) == {Status.CANCELLED}
