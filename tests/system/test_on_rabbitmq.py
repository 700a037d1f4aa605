"""The system tests whose behaviour depends on the broker, run again on RabbitMQ (Celery's default
broker) with publisher confirms; their own modules (test_celery.py, test_batch_worker_crash.py,
test_dispatcher.py, test_durable_task.py, test_call_starts.py) run them on Redis.

Each test below is the same function as in its own module, collected here a second time: in this
module the `broker` fixture, which `worker` builds on, is a RabbitMQ virtual host of the test's own
(tests/support/brokers.py). They are the tests of what a broker does differently: publishing (pipelined on
Redis, one confirmed message at a time on RabbitMQ), routing to a named queue, messages published
ahead of their due time with a Celery ETA, a killed worker's unacknowledged messages (redelivered at
once by RabbitMQ when its connection drops; after the visibility timeout by Redis), a batch rejected
by a dying pool process and delivered again, the same message published twice, a message that
waits in the broker while no worker runs, and priorities (honoured on queues with x-max-priority).
"""

import json

import pytest
from amqp.exceptions import MessageNacked
from kombu.exceptions import OperationalError

from tests.support.brokers import rabbitmq as broker  # noqa: F401  (the broker of this module's tests)
from tests.support.brokers import rabbitmqctl
from tests.system.test_batch_worker_crash import (  # noqa: F401
    test_a_worker_that_dies_inside_a_batch_gets_it_again_and_runs_the_rest_once,
)
from tests.system.test_call_starts import (  # noqa: F401
    test_a_call_is_started_while_its_message_waits_and_runs_at_its_eta,
    test_a_stopping_worker_gives_back_the_calls_it_started_ahead,
)
from tests.system.test_celery import (  # noqa: F401
    finished,
    scan_until,
    test_due_tasks_run_once_on_their_queue_and_never_early,
    test_lease_expiry_redispatches_a_task_whose_worker_was_killed,
)
from tests.system.test_dispatcher import test_a_task_due_in_200_ms_starts_on_time_without_any_scan  # noqa: F401
from tests.system.test_durable_task import (  # noqa: F401
    test_a_call_published_twice_runs_once,
    test_a_call_that_expires_on_its_way_to_the_worker_ends_cancelled,
    test_a_worker_killed_with_calls_pending_loses_none,
    test_calls_run_at_their_time_once_with_their_task_id_and_arguments_never_early,
    test_routing_to_a_named_queue_and_a_link_callback,
    test_the_dispatcher_starts_calls_on_time_without_a_scan,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.rabbitmq]


@pytest.mark.timeout(60)
def test_a_message_the_broker_refuses_releases_its_claim_at_once(worker, broker, starts):  # noqa: F811
    """With publisher confirms, a message RabbitMQ refuses (here its queue is full and rejects
    publishes) fails the publish: the claim goes back to PENDING at once instead of waiting out its
    lease, and the task runs, once, when the queue takes messages again."""
    from timeouts.dispatch.scan import scan
    from timeouts.models import TimeoutTask

    full = json.dumps({"max-length": 0, "overflow": "reject-publish"})
    rabbitmqctl("set_policy", "-p", broker.vhost, "--apply-to", "queues", "full", "^celery$", full)
    task = TimeoutTask.objects.schedule("test.record", "refused", delay=-1)
    with pytest.raises(OperationalError) as refused:
        scan()
    assert isinstance(refused.value.__cause__, MessageNacked)
    assert TimeoutTask.objects.get(pk=task.pk).status == TimeoutTask.Status.PENDING
    rabbitmqctl("clear_policy", "-p", broker.vhost, "full")
    scan_until(finished(1), 30, "the task, once its queue takes messages")
    assert [row[0] for row in starts.all()] == [task.job_id]


@pytest.fixture
def queues_with_priorities(broker):  # noqa: F811
    """This process's Celery app declaring its queues with x-max-priority 1 (task_queue_max_priority)."""
    from project.celery import app

    cached = ("queues", "default_queue", "router", "send_task_message")  # Celery's, built from task_queues
    previous = app.conf.task_queue_max_priority
    # Celery writes x-max-priority into the configured queues' own arguments: put them back after.
    arguments = [(queue, dict(queue.queue_arguments or {})) for queue in app.conf.task_queues or ()]
    app.conf.task_queue_max_priority = 1
    for name in cached:
        app.amqp.__dict__.pop(name, None)
    try:
        yield app
    finally:
        app.conf.task_queue_max_priority = previous
        for queue, queue_arguments in arguments:
            queue.queue_arguments = queue_arguments
        for name in cached:
            app.amqp.__dict__.pop(name, None)


@pytest.mark.timeout(60)
def test_on_a_queue_with_priorities_a_backlog_s_messages_go_after_those_claimed_on_time(queues_with_priorities):
    from tests.integration.worker.test_batches import schedule_due
    from timeouts.dispatch.claiming import claim_due
    from timeouts.dispatch.publishing import publish

    app = queues_with_priorities
    backlog = [t.job_id for t in schedule_due("test.record", 3, ago=5)]
    publish(claim_due(100))
    on_time = [t.job_id for t in schedule_due("test.slow", 2, ago=0)]
    publish(claim_due(100))
    taken = []
    with app.connection_for_read() as connection, connection.SimpleQueue(app.amqp.queues["celery"]) as queue:
        for _ in range(2):
            message = queue.get(timeout=5)
            taken.append(([item[0] for item in message.payload[0][0]], message.properties.get("priority")))
            message.ack()
    assert taken == [(on_time, 1), (backlog, 0)]  # published after the backlog, taken first
