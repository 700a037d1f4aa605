"""A Celery worker that reconnects to RabbitMQ must not stop consuming over its prefetch count.

When a worker reconnects to its broker while tasks still run, Celery lowers the prefetch count of
the new connection, then raises it again from the code that acknowledges each message received
since (`worker_enable_prefetch_count_reduction`, on by default). That code runs in the thread that
finishes the task: with `-P threads`, a pool thread, which then sends RabbitMQ the new prefetch
count (basic.qos) and reads the answer from the socket that the worker's main thread reads too.
The two threads split the frames between them, each waits for bytes the other took, and the
worker consumes nothing more (its main thread spinning, a CPU at 100 %).

So `setup()` turns that reduction off where the project left Celery's default: after a
reconnect, the worker asks at once for its whole prefetch (concurrency x
worker_prefetch_multiplier, which `setup()` sets to 1), and the messages beyond its free
processes wait in the worker, not in the broker, until the tasks still running end (at the latest
at their time limit).

Checked against Celery 5.7.0. tests/unit/worker/test_reconnect_prefetch.py fails on another Celery: check
there that the prefetch count is still raised from the acknowledging thread, then add the version.
"""


def apply(conf) -> None:
    """Turn Celery's prefetch reduction after a reconnect off, if the project left it on (Celery's
    default)."""
    if conf.get("worker_enable_prefetch_count_reduction") is True:
        conf.worker_enable_prefetch_count_reduction = False
