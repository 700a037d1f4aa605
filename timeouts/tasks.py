"""The Celery tasks of timeouts. Their names are public: hosts route, monitor and
schedule them by name."""

from contextlib import contextmanager, nullcontext

from celery import shared_task
from django.db import close_old_connections, connections

from . import batches, own_connection, partitions, recovery, running
from . import scan as scanning
from .publishing import RUN, RUN_BATCH

# The beat tasks start with close_old_connections(), as Django starts a request: when the host lets
# Celery keep connections (CELERY_DB_REUSE_MAX), a connection that broke or outlived CONN_MAX_AGE is
# replaced here rather than failing the task. Without reuse, Celery has closed them already.
# The tasks that start handlers run timeouts' statements on the worker's own connection
# (own_connection.py) and leave Django's to the handlers (see _for_the_message).


@contextmanager
def _for_the_message(request):
    """Timeouts' statements on the worker's own connection while the message runs; then, for the
    handlers' sake, what close_old_connections() does to Django's connections, and the health check
    (CONN_HEALTH_CHECKS), once the message is done and the worker has nothing else to do. Done
    first, as for a request, the check would cost a round trip before a task that is already due."""
    try:
        # Eager (task_always_eager) or called as a function: in the caller's process, perhaps inside
        # its transaction, which timeouts' statements must then join.
        in_the_callers_process = request.is_eager or request.called_directly
        with nullcontext() if in_the_callers_process else own_connection.used():
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
@shared_task(name=RUN, bind=True, ignore_result=True, acks_late=True, reject_on_worker_lost=True)
def run(self, job_id, action_time, attempt, partition):
    with _for_the_message(self.request):
        return running.run(job_id, action_time, attempt, partition)


# Tasks due together, in one message (RUN_BATCH_SIZE): each still runs as `run` above would. A
# worker that dies part way gets the message again; the tasks that already started are dropped by
# their compare-and-set, the others run.
@shared_task(name=RUN_BATCH, bind=True, ignore_result=True, acks_late=True, reject_on_worker_lost=True)
def run_batch(self, items):
    with _for_the_message(self.request):
        return batches.run_batch(items)


@shared_task(name="timeouts.maintain", ignore_result=True)
def maintain():
    close_old_connections()
    report = partitions.maintain()
    recovery.recover_expired()
    return report.summary()
