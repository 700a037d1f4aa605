"""DurableTask's producer side on the real database and broker, without a worker: what a call
stores, what it publishes directly, and the message the scan publishes when the call is due."""

import base64
import json
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from celery import current_app
from django.db import InterfaceError, transaction
from django.db import OperationalError as DatabaseOperationalError
from kombu.exceptions import OperationalError

import timeouts.celery
from tests.integration import waits
from tests.support.durable_routers import FailingFirst, routed_by
from tests.testapp import tasks
from timeouts import InvalidAttribute, TimeoutsError
from timeouts.dispatch.scan import scan
from timeouts.durable.calls import PREFIX
from timeouts.models import TimeoutTask
from timeouts.protocol import FENCE_HEADER

Status = TimeoutTask.Status
pytestmark = pytest.mark.django_db(transaction=True)


def calls():
    return list(TimeoutTask.objects.filter(biz_type__startswith=PREFIX).order_by("job_id"))


def messages(broker, queue="celery"):
    """The messages waiting in a Redis queue, oldest first, as (headers, [args, kwargs, embed], properties).
    (kombu keeps a priority's messages in a list of their own, named after the queue.)"""
    found = []
    keys = [queue.encode()] + sorted(key for key in broker.keys(queue + "\x06\x16*"))
    for raw in (raw for key in keys for raw in reversed(broker.lrange(key, 0, -1))):
        payload = json.loads(raw)
        found.append((payload["headers"], json.loads(base64.b64decode(payload["body"])), payload["properties"]))
    return found


@pytest.fixture
def queues(broker):
    broker.flushdb()
    yield broker
    broker.flushdb()


def test_a_countdown_call_is_stored_not_sent(queues):
    before = datetime.now(UTC)
    result = tasks.record.apply_async((1, "a"), {"k": [1, 2]}, countdown=60)
    [row] = calls()
    assert (row.biz_type, row.biz_id, row.status) == ("celery:tests.durable.record", result.id, Status.PENDING)
    assert before + timedelta(seconds=60) <= row.action_time <= datetime.now(UTC) + timedelta(seconds=60)
    assert row.attribute["task"] == "tests.durable.record"
    assert (row.attribute["args"], row.attribute["kwargs"]) == ([1, "a"], {"k": [1, 2]})
    assert messages(queues) == []


def test_calls_without_eta_or_already_due_are_published_as_celery_does(queues):
    sent = [tasks.record.delay(1), tasks.record.apply_async((2,), countdown=0),
            tasks.record.apply_async((3,), eta=datetime.now(UTC) - timedelta(seconds=1))]
    assert calls() == []
    found = messages(queues)
    assert [headers["id"] for headers, _, _ in found] == [result.id for result in sent]
    assert [body[0] for _, body, _ in found] == [[1], [2], [3]]
    assert all(FENCE_HEADER not in headers for headers, _, _ in found)


def test_an_eta_call_is_due_at_its_eta():
    eta = datetime.now(UTC) + timedelta(minutes=5)
    tasks.record.apply_async((1,), eta=eta)
    tasks.record.apply_async((2,), eta=eta.isoformat())
    assert [row.action_time for row in calls()] == [eta, eta]


def test_a_rolled_back_call_was_never_stored():
    with pytest.raises(RuntimeError), transaction.atomic():
        tasks.record.apply_async((1,), countdown=60)
        assert len(calls()) == 1
        raise RuntimeError
    assert calls() == []


@pytest.mark.parametrize("args", [(object(),), (float("nan"),), ("nul\x00",), ("x" * 70_000,)],
                         ids=["object", "nan", "nul", "too-large"])
def test_what_json_cannot_carry_is_refused_with_schedules_error_and_nothing_stored(args):
    with pytest.raises(InvalidAttribute, match="tests.durable.record"):
        tasks.record.apply_async(args, countdown=60)
    assert calls() == []
    assert issubclass(InvalidAttribute, TimeoutsError)


def test_cancel_by_task_id_is_final():
    result = tasks.record.apply_async((1,), countdown=60)
    assert timeouts.celery.cancel(result.id) is True
    assert timeouts.celery.cancel(result) is False  # nothing left waiting
    assert [row.status for row in calls()] == [Status.CANCELLED]
    assert timeouts.celery.cancel("no-such-task-id") is False


def test_the_due_call_is_published_as_its_own_message_with_the_fence(queues):
    result = tasks.record.apply_async((1, Decimal("2.5")), {"when": datetime(2030, 1, 2, tzinfo=UTC)},
                                      countdown=0.2, queue="timeouts-test-other", priority=3, headers={"mine": "x"})
    waits.until_all_due()
    scan()
    [row] = calls()
    assert row.status == Status.DISPATCHED
    assert messages(queues) == []
    [(headers, (args, kwargs, embed), properties)] = messages(queues, "timeouts-test-other")
    assert (headers["id"], headers["task"], headers["eta"]) == (result.id, "tests.durable.record", None)
    assert headers["mine"] == "x"
    assert headers[FENCE_HEADER][:3] == [row.job_id, row.action_time.isoformat(), 1]
    assert args[0] == 1 and args[1] == {"__type__": "decimal", "__value__": "2.5"}  # Celery's own JSON
    assert kwargs["when"]["__type__"] == "datetime"
    assert properties["priority"] == 3 and properties["correlation_id"] == result.id


def test_an_expired_call_is_not_sent_and_says_so(queues):
    tasks.record.apply_async((1,), countdown=0.2, expires=0.1)
    waits.until_all_due()
    scan()
    [row] = calls()
    assert row.status == Status.CANCELLED and "expired" in row.last_error
    assert messages(queues) == []


def test_a_fence_in_the_callers_headers_is_not_stored():
    tasks.record.apply_async((1,), countdown=60, headers={FENCE_HEADER: [1, "x", 1, None], "mine": 1})
    [row] = calls()
    assert row.attribute["headers"] == {"mine": 1}


def test_celerys_own_tasks_keep_celerys_ways(queues):
    current_app.loader.import_default_modules()
    unlock = current_app.tasks["celery.chord_unlock"]
    unlock.apply_async(("group-id", {"task": "x"}), countdown=30)
    assert calls() == []


def test_eager_calls_run_at_once_as_celery_runs_them():
    from django.db import connection

    from tests.testapp import recorder

    with connection.cursor() as cursor:
        cursor.execute(tasks.CALLS_TABLE_SQL)
    current_app.conf.task_always_eager = True
    try:
        result = tasks.add.apply_async((2, 3), countdown=60)
    finally:
        current_app.conf.task_always_eager = False
        recorder.close()
    assert result.get() == 5
    assert calls() == []


def test_timeouts_stats_counts_calls_by_task_name():
    from io import StringIO

    from django.core.management import call_command

    tasks.record.apply_async((1,), countdown=60)
    out = StringIO()
    call_command("timeouts_stats", stdout=out)
    assert "celery:tests.durable.record" in out.getvalue()


def test_a_chain_step_keeps_the_rest_of_its_chain():
    from celery import chain

    chain(tasks.record.s(1), tasks.record.s(2)).apply_async(countdown=60)
    [row] = calls()
    [rest] = row.attribute["message"]["chain"]
    assert rest["task"] == "tests.durable.record" and rest["args"] == [2]


def test_a_call_whose_message_cannot_be_made_ends_dead_instead_of_coming_back(queues):
    tasks.record.apply_async((1,), countdown=0.2)
    TimeoutTask.objects.filter(biz_type__startswith=PREFIX).update(attribute={"format": 1})
    waits.until_all_due()
    scan()
    [row] = calls()
    assert row.status == Status.DEAD and "cannot be made" in row.last_error
    assert messages(queues) == []


def error_kind(error) -> str:
    return f"{type(error).__module__.split('.')[0]}.{type(error).__name__}"  # django.OperationalError


@pytest.mark.parametrize("error", [DatabaseOperationalError("server closed the connection unexpectedly"),
                                   InterfaceError("connection already closed"),
                                   OperationalError("Error 111 connecting to 127.0.0.1:6379. Connection refused."),
                                   TimeoutError("timed out")], ids=lambda error: error_kind(error))
def test_a_fault_while_a_message_is_made_gives_the_claim_back_to_be_published_later(queues, error):
    tasks.record.apply_async((1,), countdown=0.2)
    waits.until_all_due()
    with routed_by(FailingFirst(error)) as router:
        with pytest.raises(type(error)):
            scan()
        [row] = calls()
        assert (row.status, row.attempts, row.last_error) == (Status.PENDING, 0, "")
        assert messages(queues) == []
        scan()
    [row] = calls()
    assert row.status == Status.DISPATCHED and router.failed == 1
    [(headers, _, _)] = messages(queues)
    assert headers[FENCE_HEADER][:3] == [row.job_id, row.action_time.isoformat(), 1]


def _with(**changes):
    return lambda attribute: {**attribute, **changes}


@pytest.mark.parametrize(("change", "router", "says"), [
    (_with(format=99), None, "format 99"),
    (_with(args=5), None, "TypeError('task args must be a list or tuple')"),
    (_with(), FailingFirst(ValueError("no queue for this task")), "ValueError('no queue for this task')"),
], ids=["unknown format", "args not a list", "refused by the router"])
def test_a_call_that_can_never_become_a_message_ends_dead_and_says_why(queues, change, router, says):
    tasks.record.apply_async((1,), countdown=0.2)
    [row] = calls()
    TimeoutTask.objects.filter(job_id=row.job_id).update(attribute=change(row.attribute))
    waits.until_all_due()
    with routed_by(router or FailingFirst(None, times=0)):
        scan()
    [row] = calls()
    assert row.status == Status.DEAD and row.attempts == 0
    assert row.last_error.startswith("its message cannot be made: ") and says in row.last_error
    assert messages(queues) == []


def test_no_handler_may_take_a_biz_type_of_celery_calls():
    from django.core.exceptions import ImproperlyConfigured

    import timeouts

    with pytest.raises(ImproperlyConfigured, match="DurableTask"):
        timeouts.handler("celery:tests.durable.record")(lambda task: None)


def test_the_admin_lists_calls_by_task_name(admin_client):
    result = tasks.record.apply_async((1,), countdown=60)
    response = admin_client.get("/admin/timeouts/timeouttask/", {"biz_type": "celery:tests.durable.record"})
    assert response.status_code == 200
    assert result.id in response.content.decode()
    listing = admin_client.get("/admin/timeouts/timeouttask/").content.decode()
    assert "?biz_type=celery%3Atests.durable.record" in listing  # offered by the filter


def test_claimed_calls_go_back_when_the_broker_cannot_be_reached(monkeypatch):
    from celery import Celery

    tasks.record.apply_async((1,), countdown=0.2)
    waits.until_all_due()
    monkeypatch.setenv("CELERY_BROKER_URL", "redis://127.0.0.1:9/0")  # Celery prefers it to broker=
    unreachable = Celery("unreachable", set_as_current=False)
    previous = current_app._get_current_object()
    unreachable.set_current()
    try:
        with pytest.raises(OperationalError, match="Connection refused"):
            scan()
    finally:
        previous.set_current()
    [row] = calls()
    assert row.status == Status.PENDING and row.attempts == 0
