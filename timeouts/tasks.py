"""The Celery tasks of timeouts. Names are part of the public contract."""

from celery import shared_task
from django.db import close_old_connections

from . import batches, partitions, recovery, running
from . import scan as scanning

# Each task starts with close_old_connections(), as Django starts a request: when the host lets
# Celery keep connections (CELERY_DB_REUSE_MAX), a connection that broke or outlived CONN_MAX_AGE is
# replaced here rather than failing the task. Without reuse, Celery has closed them already.


@shared_task(name="timeouts.scan", ignore_result=True)
def scan():
    close_old_connections()
    return scanning.scan()


# acks_late + reject_on_worker_lost: a message whose worker died is delivered again; the
# compare-and-set then drops it if the attempt had already started (lease recovery retries that).
@shared_task(name="timeouts.run", ignore_result=True, acks_late=True, reject_on_worker_lost=True)
def run(job_id, action_time, attempt):
    close_old_connections()
    return running.run(job_id, action_time, attempt)


# Tasks due together, in one message (RUN_BATCH_SIZE): each still runs as `run` above would. A
# worker that dies part way gets the message again; the tasks that already started are dropped by
# their compare-and-set, the others run.
@shared_task(name="timeouts.run_batch", ignore_result=True, acks_late=True, reject_on_worker_lost=True)
def run_batch(items):
    close_old_connections()
    return batches.run_batch(items)


@shared_task(name="timeouts.maintain", ignore_result=True)
def maintain():
    close_old_connections()
    report = partitions.maintain()
    recovery.recover_expired()
    return report.summary()
