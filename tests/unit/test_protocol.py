"""The message from the dispatcher to the worker (protocol.py): each wire form round-trips, and the
forms already in brokers (written by the current and the previous producers) decode."""

from datetime import UTC, datetime, timedelta

import pytest

from timeouts import protocol
from timeouts.dispatch.claiming import Claim
from timeouts.protocol import Fence

ACTION_TIME = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
RUN_AT = ACTION_TIME + timedelta(seconds=30)
PARTITION = "timeouts_task_d20260102"


def claim(shard="default") -> Claim:
    return Claim(7, ACTION_TIME, RUN_AT, "test.ok", 2, 30, ACTION_TIME, PARTITION, None, shard)


@pytest.mark.parametrize("fence", [
    Fence(7, ACTION_TIME, 2, PARTITION),
    Fence(7, ACTION_TIME, 2, None, "other"),
    Fence(2**62, ACTION_TIME.astimezone(UTC), 11, PARTITION, "shard_3"),
])
def test_a_run_message_round_trips(fence):
    assert protocol.from_run(*protocol.run_args(fence), **protocol.run_kwargs(fence)) == fence


@pytest.mark.parametrize("shard", ["default", "other"])
def test_a_batch_item_round_trips(shard):
    fence = Fence(7, ACTION_TIME, 2, PARTITION, shard, RUN_AT)
    assert protocol.from_batch_item(protocol.batch_item(fence), shard) == fence


@pytest.mark.parametrize("shard", ["default", "other"])
def test_a_header_round_trips(shard):
    fence = Fence(7, ACTION_TIME, 2, PARTITION, shard)
    assert protocol.from_header(protocol.header(fence)) == fence
    started = {"row": {"job_id": 7, "ttr": 30}, "not_before": 12.5}
    decoded = protocol.from_header(protocol.header(fence.with_started(started)))
    assert decoded == fence and decoded.started == started


def test_the_claims_messages_are_the_wire_forms():
    """What brokers hold: a change here would leave messages already sent unreadable."""
    action_time, run_at = ACTION_TIME.isoformat(), RUN_AT.isoformat()
    assert claim().message_args() == [7, action_time, 2, PARTITION]
    assert claim().message_kwargs() == {}
    assert claim("other").message_kwargs() == {"shard": "other"}
    assert claim().batch_item() == [7, action_time, 2, run_at, PARTITION]
    assert protocol.header(claim("other").fence) == [7, action_time, 2, PARTITION, "other"]


def test_todays_wire_forms_decode():
    action_time, run_at = "2026-01-02T03:04:05.678901+00:00", "2026-01-02T03:04:35.678901+00:00"
    assert protocol.from_run(7, action_time, 2, PARTITION) == Fence(7, ACTION_TIME, 2, PARTITION, "default")
    assert protocol.from_run(7, action_time, 2, None, shard="other") == Fence(7, ACTION_TIME, 2, None, "other")
    assert protocol.from_batch_item([7, action_time, 2, run_at, PARTITION], "other") == Fence(
        7, ACTION_TIME, 2, PARTITION, "other", RUN_AT)
    fence = protocol.from_header([7, action_time, 2, PARTITION, "other"])
    assert fence == Fence(7, ACTION_TIME, 2, PARTITION, "other") and fence.started is None
    started = {"row": {}, "not_before": 1.0}
    assert protocol.from_header([7, action_time, 2, PARTITION, "other", started]).started == started


def test_a_header_of_four_fields_is_the_default_shards():
    """Written before calls named their shard."""
    fence = protocol.from_header([7, ACTION_TIME.isoformat(), 2, PARTITION])
    assert fence == Fence(7, ACTION_TIME, 2, PARTITION, "default") and fence.started is None
    # Started ahead, it is written back in the whole form: a fifth field is always the shard.
    assert protocol.header(fence.with_started({}))[4:] == ["default", {}]


def test_the_key_addresses_the_row():
    assert Fence(7, ACTION_TIME, 2).key == {"job_id": 7, "action_time": ACTION_TIME}


def test_a_call_item_round_trips():
    item = protocol.call_item({"id": "a", "task": "t"}, {"correlation_id": "a"}, [[1], {"k": 2}, {}])
    assert protocol.from_call_item(item) == ({"id": "a", "task": "t"}, {"correlation_id": "a"}, [[1], {"k": 2}, {}])


@pytest.mark.parametrize("item", [None, 1, [], [{}, {}], [{}, {}, [1, 2]], [[], {}, [1, {}, {}]],
                                  [{}, None, [1, {}, {}]], [{}, {}, {}, []]])
def test_what_is_not_a_call_item_is_refused(item):
    with pytest.raises(ValueError, match="timeouts.calls"):
        protocol.from_call_item(item)
