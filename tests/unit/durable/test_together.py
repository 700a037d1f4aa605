"""Which claimed calls may travel together (durable/together.py), without a broker."""

from celery import current_app
from kombu import Queue

from timeouts.durable import together


def message(task_id="a", sent_event=None):
    made = current_app.amqp.create_task_message(task_id, "tests.durable.record", [1], {})
    return made._replace(sent_event=sent_event)


def test_calls_with_the_same_publishing_options_share_a_key_whatever_their_headers():
    first = together.key(message("a"), {"queue": "q", "priority": 3, "headers": {"timeouts": [1, "x", 1, None]}})
    second = together.key(message("b"), {"priority": 3, "queue": "q", "headers": {"timeouts": [2, "y", 1, None]}})
    assert first == second and first is not None


def test_a_queue_exchange_routing_key_priority_or_property_apart_sets_calls_apart():
    base = {"queue": "q", "exchange": "e", "routing_key": "r", "priority": 3}
    keys = {together.key(message(), base)}
    for change in ({"queue": "other"}, {"exchange": "other"}, {"routing_key": "other"}, {"priority": 4},
                   {"priority": None}, {"expiration": 10.0}):
        keys.add(together.key(message(), {**base, **change}))
    assert len(keys) == 7


def test_kombu_queues_are_told_apart_by_their_bindings():
    assert together.key(message(), {"queue": Queue("q", routing_key="a")}) == \
        together.key(message(), {"queue": Queue("q", routing_key="a")})
    assert together.key(message(), {"queue": Queue("q", routing_key="a")}) != \
        together.key(message(), {"queue": Queue("q", routing_key="b")})


def test_a_call_whose_message_sends_a_sent_event_goes_alone():
    assert together.key(message(sent_event={"uuid": "a"}), {"queue": "q"}) is None


def test_calls_due_already_travel_apart_from_calls_claimed_ahead_and_fewer_to_a_message():
    due, ahead = together.key(message(), {"queue": "q"}, due=True), together.key(message(), {"queue": "q"})
    assert due != ahead
    assert together.most(due) < together.most(ahead)
