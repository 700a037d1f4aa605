"""The Celery tasks of timeouts. Their names are public: hosts route, monitor and
schedule them by name."""

import logging
from contextlib import contextmanager
from datetime import UTC, datetime

from celery import shared_task
from django.db import DEFAULT_DB_ALIAS, close_old_connections, connections

from timeouts import protocol
from timeouts.dispatch import scan as scanning
from timeouts.protocol import BACKLOG_AFTER, RUN, RUN_BATCH
from timeouts.storage import partitions, shards
from timeouts.store import recovery, worker_connection
from timeouts.worker import batches, priority, running

logger = logging.getLogger(__name__)

# The beat tasks start with close_old_connections(), as Django starts a request: when the host lets
# Celery keep connections (CELERY_DB_REUSE_MAX), a connection that broke or outlived CONN_MAX_AGE is
# replaced here rather than failing the task. Without reuse, Celery has closed them already.
# The tasks that start handlers run timeouts' statements on the worker's own connection
# (worker_connection.py) and leave Django's to the handlers (see _for_the_message).


@contextmanager
def _for_the_message(request, shard):
    """Timeouts' statements on the worker's own connection to the task's shard while the message
    runs; then, for the handlers' sake, what close_old_connections() does to Django's connections,
    and the health check (CONN_HEALTH_CHECKS), once the message is done and the worker has nothing
    else to do. Done first, as for a request, the check would cost a round trip before a task that
    is already due."""
    try:
        # Eager (task_always_eager) or called as a function: in the caller's process, perhaps inside
        # its transaction, which timeouts' statements must then join.
        in_the_callers_process = request.is_eager or request.called_directly
        with worker_connection.shared(shard) if in_the_callers_process else worker_connection.used(shard):
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
def run(self, job_id, action_time, attempt, partition, shard=DEFAULT_DB_ALIAS):
    with _for_the_message(self.request, shard):
        return running.run(protocol.from_run(job_id, action_time, attempt, partition, shard))


# Tasks due together, in one message (RUN_BATCH_SIZE): each still runs as `run` above would. A
# worker that dies part way gets the message again; the tasks that already started are dropped by
# their compare-and-set, the others run. A backlog's batch gives way to tasks claimed on time.
@shared_task(name=RUN_BATCH, bind=True, ignore_result=True, acks_late=True, reject_on_worker_lost=True)
def run_batch(self, items, shard=DEFAULT_DB_ALIAS):
    give_way = priority.GiveWay(self, shard) if _in_backlog(self.request, items) else None
    with _for_the_message(self.request, shard):
        return batches.run_batch(items, give_way, shard)


def _in_backlog(request, items) -> bool:
    """A backlog's batch: published without an ETA, its first task due for longer than BACKLOG_AFTER."""
    if request.eta is not None:
        return False
    return datetime.now(UTC) - protocol.from_batch_item(items[0]).run_at > BACKLOG_AFTER


@shared_task(name="timeouts.maintain", ignore_result=True)
def maintain():
    close_old_connections()
    summaries, failure = {}, None
    for alias in shards.aliases():  # a shard that fails fails the task, after every shard's turn
        try:
            summaries[alias] = partitions.maintain(alias).summary()
            with worker_connection.shared(alias):
                recovery.recover_expired()
        except Exception as exc:
            logger.exception("timeouts: the maintenance of shard %r failed", alias)
            failure = failure or exc
    if failure is not None:
        raise failure
    return next(iter(summaries.values())) if len(summaries) == 1 else summaries
