"""The Celery tasks of timeouts. Names are part of the public contract."""

from celery import shared_task

from . import partitions, recovery, running, scan as scanning


@shared_task(name="timeouts.scan", ignore_result=True)
def scan():
    return scanning.scan()


# acks_late + reject_on_worker_lost: a message whose worker died is delivered again; the
# compare-and-set then drops it if the attempt had already started (lease recovery retries that).
@shared_task(name="timeouts.run", ignore_result=True, acks_late=True, reject_on_worker_lost=True)
def run(job_id, action_time, attempt):
    return running.run(job_id, action_time, attempt)


@shared_task(name="timeouts.maintain", ignore_result=True)
def maintain():
    report = partitions.maintain()
    recovery.recover_expired()
    return report.summary()
