"""setup() turns off Celery's prefetch reduction after a reconnect (timeouts/worker/reconnect_prefetch.py),
whose raising of the prefetch count runs in the thread that acknowledges a message: a `-P threads`
worker on RabbitMQ stopped consuming after the broker came back (tests/reliability,
test_rabbitmq_faults.py with a threads pool). The guard below fails on a Celery this was not
checked against."""

import inspect

import celery
from celery import Celery
from celery.worker.consumer.consumer import Consumer

import timeouts.celery

# The Celery versions whose worker was checked to raise the prefetch count after a reconnect from
# the promise that acknowledges a message, that is in the acknowledging thread.
CHECKED = {"5.7.0"}


def test_celery_is_a_version_the_workaround_was_checked_against():
    assert celery.__version__ in CHECKED, (
        f"Celery {celery.__version__}: check that timeouts/worker/reconnect_prefetch.py still applies "
        "(Consumer.create_task_handler chaining _restore_prefetch_count_after_connection_restart on "
        "the ack and reject promises), then add the version")


def test_the_setting_turned_off_still_stops_what_it_guards():
    restore = inspect.getsource(Consumer._restore_prefetch_count_after_connection_restart)
    assert "worker_enable_prefetch_count_reduction" in restore
    assert "_restore_prefetch_count_after_connection_restart" in inspect.getsource(Consumer.create_task_handler)


def new_app(**conf):
    app = Celery("host", broker="memory://", set_as_current=False)
    app.conf.update(conf)
    return app


def test_setup_turns_the_prefetch_reduction_after_a_reconnect_off():
    app = new_app()
    assert app.conf.worker_enable_prefetch_count_reduction is True  # Celery's default
    timeouts.celery.setup(app)
    assert app.conf.worker_enable_prefetch_count_reduction is False
