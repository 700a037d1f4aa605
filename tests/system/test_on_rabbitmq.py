"""The system tests whose behaviour depends on the broker, run again on RabbitMQ (Celery's default
broker) with publisher confirms; test_celery.py, test_dispatcher.py and test_durable_task.py run
them on Redis.

Each test below is the same function as in its own module, collected here a second time: in this
module the `broker` fixture, which `worker` builds on, is a RabbitMQ virtual host of the test's own
(tests/brokers.py). They are the tests of what a broker does differently: publishing (pipelined on
Redis, one confirmed message at a time on RabbitMQ), routing to a named queue, messages published
ahead of their due time with a Celery ETA, a killed worker's unacknowledged messages (redelivered at
once by RabbitMQ when its connection drops; after the visibility timeout by Redis), the same message
published twice, and a message that waits in the broker while no worker runs.
"""

import pytest

from tests.brokers import rabbitmq as broker  # noqa: F401  (the broker of this module's tests)
from tests.system.test_celery import (  # noqa: F401
    test_due_tasks_run_once_on_their_queue_and_never_early,
    test_lease_expiry_redispatches_a_task_whose_worker_was_killed,
)
from tests.system.test_dispatcher import test_a_task_due_in_200_ms_starts_on_time_without_any_scan  # noqa: F401
from tests.system.test_durable_task import (  # noqa: F401
    runs,
    test_a_call_published_twice_runs_once,
    test_a_call_that_expires_on_its_way_to_the_worker_ends_cancelled,
    test_a_worker_killed_with_calls_pending_loses_none,
    test_calls_run_at_their_time_once_with_their_task_id_and_arguments_never_early,
    test_routing_to_a_named_queue_and_a_link_callback,
    test_the_dispatcher_starts_calls_on_time_without_a_scan,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]
