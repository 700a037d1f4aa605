"""The priorities of timeouts' messages by broker: a backlog's go after those claimed on time."""

import pytest

from timeouts.dispatch.publishing import priorities


@pytest.mark.parametrize("url,expected", [
    ("redis://127.0.0.1:6379/0", (None, 9)),  # kombu's lists per priority step, 0 read first: the backlog last
    ("rediss://cache.example:6380/1", (None, 9)),
    ("sentinel://10.0.0.1:26379", (None, 9)),
    ("amqp://guest:guest@127.0.0.1:5672//", (1, None)),  # the higher first, on queues with x-max-priority
    ("pyamqp+ssl://rabbit.example//", (1, None)),
    (None, (1, None)),  # unset: Celery's default broker, RabbitMQ
    ("sqs://", (None, None)),  # as routed
])
def test_a_backlog_s_messages_go_after_those_claimed_on_time_on_brokers_with_priorities(url, expected):
    assert priorities(url) == expected
