"""A claimed DurableTask call whose message cannot be made this time: a fault of the database, the
broker or the network gives the claim back, and the call runs once, later; only a call that can
never become a message ends DEAD. Real dispatcher, real worker, and a host's task router that reads
a database."""

import time

import pytest
from django.db import OperationalError

from tests.support import processes
from tests.support.durable_routers import FailingFirst, routed_by
from tests.system.test_dispatcher import dispatcher_thread
from tests.testapp import tasks
from timeouts.durable.calls import PREFIX
from timeouts.models import TimeoutTask

Status = TimeoutTask.Status
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def settled():
    return not TimeoutTask.objects.filter(biz_type__startswith=PREFIX,
                                          status__in=[Status.PENDING, Status.DISPATCHED, Status.RUNNING]).exists()


@pytest.mark.timeout(60)
def test_a_database_error_while_its_message_is_made_runs_the_call_once_later(worker, runs):
    router = FailingFirst(OperationalError("the routing database went away"))
    with routed_by(router), dispatcher_thread() as dispatcher:
        result = tasks.record.apply_async(("routed late",), countdown=0.3)
        processes.wait_for(lambda: runs.count() == 1 and settled(), 30, message="the call to run")
        time.sleep(1)  # a second run would show now
    assert router.failed == 1 and dispatcher.stats.publish_failures >= 1
    assert [run[0] for run in runs.all()] == [result.id]
    row = TimeoutTask.objects.get(biz_id=result.id)
    assert (row.status, row.attempts, row.last_error) == (Status.DONE, 1, "")
