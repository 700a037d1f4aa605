"""The Celery tasks of timeouts. Names are part of the public contract."""

from contextlib import contextmanager

from celery import shared_task
from django.db import close_old_connections, connections

from . import batches, partitions, recovery, running
from . import scan as scanning

# Each task starts with close_old_connections(), as Django starts a request: when the host lets
# Celery keep connections (CELERY_DB_REUSE_MAX), a connection that broke or outlived CONN_MAX_AGE is
# replaced here rather than failing the task. Without reuse, Celery has closed them already.
# The tasks that start handlers do it after the message instead (see _after_the_message).


@contextmanager
def _after_the_message():
    """close_old_connections() and the health check (CONN_HEALTH_CHECKS) once the message is done,
    while the worker has nothing else to do. Done first, as for a request, the health check would
    cost every message a round trip before its first start, when its task is already due (0.25 ms
    of the spread benchmark's 2 ms median lateness). A connection that breaks while the worker is
    idle fails the next start, which tries again on a new one (running.start)."""
    try:
        yield
    finally:
        for connection in connections.all(initialized_only=True):
            if not connection.in_atomic_block:  # a host's eager task inside its own transaction
                connection.close_if_unusable_or_obsolete()  # what close_old_connections() does
                connection.close_if_health_check_failed()


@shared_task(name="timeouts.scan", ignore_result=True)
def scan():
    close_old_connections()
    return scanning.scan()


# acks_late + reject_on_worker_lost: a message whose worker died is delivered again; the
# compare-and-set then drops it if the attempt had already started (lease recovery retries that).
# `partition` (where the claim found the row) came later: messages without it still run.
@shared_task(name="timeouts.run", ignore_result=True, acks_late=True, reject_on_worker_lost=True)
def run(job_id, action_time, attempt, partition=None):
    with _after_the_message():
        return running.run(job_id, action_time, attempt, partition)


# Tasks due together, in one message (RUN_BATCH_SIZE): each still runs as `run` above would. A
# worker that dies part way gets the message again; the tasks that already started are dropped by
# their compare-and-set, the others run.
@shared_task(name="timeouts.run_batch", ignore_result=True, acks_late=True, reject_on_worker_lost=True)
def run_batch(items):
    with _after_the_message():
        return batches.run_batch(items)


@shared_task(name="timeouts.maintain", ignore_result=True)
def maintain():
    close_old_connections()
    report = partitions.maintain()
    recovery.recover_expired()
    return report.summary()
