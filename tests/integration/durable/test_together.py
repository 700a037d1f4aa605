"""Stored calls claimed together, on the real database and broker, without a worker: those that share
their publishing options travel in one `timeouts.calls` message, each as its own message would be."""

import pytest

from tests.integration import waits
from tests.integration.durable.test_calls import calls, messages
from tests.testapp import tasks
from timeouts.dispatch.scan import scan
from timeouts.models import TimeoutTask
from timeouts.protocol import CALLS, FENCE_HEADER, from_call_item

Status = TimeoutTask.Status
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def queues(broker):
    broker.flushdb()
    yield broker
    broker.flushdb()


def test_calls_claimed_together_travel_in_one_message_each_as_its_own(queues):
    results = [tasks.record.apply_async((i,), {"n": i}, countdown=0.2, headers={"mine": i}) for i in range(5)]
    results.append(tasks.add.apply_async((1, 2), countdown=0.2))
    waits.until_all_due()
    scan()
    rows = {row.biz_id: row for row in calls()}
    assert {row.status for row in rows.values()} == {Status.DISPATCHED}
    [(headers, (args, kwargs, _), properties)] = messages(queues)
    assert headers["task"] == CALLS and headers["eta"] is None and kwargs == {}
    [items] = args
    carried = [from_call_item(item) for item in items]
    assert sorted(own["id"] for own, _, _ in carried) == sorted(result.id for result in results)
    for own, own_properties, (own_args, own_kwargs, embed) in carried:
        row = rows[own["id"]]
        assert own["task"] == row.attribute["task"]
        assert own[FENCE_HEADER][:3] == [row.job_id, row.action_time.isoformat(), 1]
        assert own_properties["correlation_id"] == own["id"]
        assert (own_args, own_kwargs) == (row.attribute["args"], row.attribute["kwargs"])
        assert own.get("mine") == row.attribute["headers"].get("mine")
        assert set(embed) >= {"callbacks", "errbacks", "chain", "chord"}


def test_calls_of_other_queues_or_priorities_travel_apart_and_one_alone_as_its_own_message(queues):
    together = [tasks.record.apply_async((i,), countdown=0.2, priority=3) for i in range(2)]
    alone = tasks.record.apply_async(("alone",), countdown=0.2)
    other = [tasks.record.apply_async((i,), countdown=0.2, queue="timeouts-test-other") for i in range(3)]
    waits.until_all_due()
    scan()
    default_queue = messages(queues)
    assert sorted(headers["task"] for headers, _, _ in default_queue) == sorted([CALLS, "tests.durable.record"])
    for headers, (args, _, _), properties in default_queue:
        if headers["task"] == CALLS:
            assert sorted(from_call_item(item)[0]["id"] for item in args[0]) == sorted(r.id for r in together)
            assert properties["priority"] == 3
            assert {from_call_item(item)[1]["priority"] for item in args[0]} == {3}
        else:
            assert headers["id"] == alone.id and FENCE_HEADER in headers
    [(headers, (args, _, _), _)] = messages(queues, "timeouts-test-other")
    assert headers["task"] == CALLS
    assert sorted(from_call_item(item)[0]["id"] for item in args[0]) == sorted(r.id for r in other)


def test_calls_claimed_ahead_together_carry_each_their_eta(queues):
    from timeouts.dispatch.claiming import claim_due
    from timeouts.dispatch.publishing import publish

    results = [tasks.record.apply_async((i,), countdown=30) for i in range(3)]
    claims = claim_due(10, lead=60)
    assert len(claims) == 3
    publish(claims)
    [(headers, (args, _, _), _)] = messages(queues)
    etas = sorted(from_call_item(item)[0]["eta"] for item in args[0])
    assert headers["task"] == CALLS and headers["eta"] == etas[0]
    assert None not in etas
    assert sorted(from_call_item(item)[0]["id"] for item in args[0]) == sorted(r.id for r in results)
