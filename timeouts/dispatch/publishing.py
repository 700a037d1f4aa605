"""Handing claimed tasks to Celery: `timeouts.run` messages (or `timeouts.run_batch` for tasks due
together), JSON, on the handler's queue.

Only due tasks are published, or tasks due within the dispatcher's short DISPATCH_LEAD: those go
in a `timeouts.run_batch` message (of one, if alone), which carries each task's run_at, with a
Celery ETA just before the first (ETA_HEADROOM), so a worker holds them for milliseconds at most.
Nothing waits in a worker's memory or in the broker long enough for a visibility timeout to matter,
and the worker's compare-and-set still refuses to start a task early by the database clock.
"""

import logging
from contextlib import nullcontext

from celery import current_app
from kombu.utils.uuid import uuid

from timeouts import tracing
from timeouts.conf import get_settings
from timeouts.dispatch.brokers import is_amqp, is_redis
from timeouts.dispatch.claiming import release
from timeouts.protocol import BACKLOG_AFTER, BUDGET, ETA_HEADROOM, RETRY_POLICY, RUN, RUN_BATCH
from timeouts.registry import find_handler, kind_of, publishing_prefixes
from timeouts.testing import faults

logger = logging.getLogger(__name__)

# Broker operations per round trip: kombu 5.7+ pipelines a producer's Redis publishes in batches.
PIPELINE_SIZE = 500
# Seconds. Tasks already due may share a message freely; a task due later shares one only with
# tasks due at most this much before it: a worker process waits in the batch until each task is
# due and takes no other message meanwhile, while Celery's ETA timer (in the worker's main
# process) hands separate messages to whichever process is free. A short window keeps tasks due
# apart in messages of their own, which run side by side (docs: explanation/benchmarks).
BATCH_WINDOW = 0.01
# The same, for a claim that also took a backlog's tasks (due over BACKLOG_AFTER ago). Every process
# is then busy with the backlog, each message claimed on time gets one that gives way for it
# (on_time_first), and tasks sharing a message run one after another at a loaded server's pace:
# apart, they run side by side. Not so without a backlog, where every message holds a process from
# its ETA to its first task, and more messages keep more of them waiting (docs:
# explanation/benchmarks).
BESIDE_BACKLOG_WINDOW = 0.002


def publish(claims) -> int:
    """Publish the claims; on a broker error, release what was not sent and re-raise. What is
    written about a claim (released, or ended unpublished) is written on its own shard. Claims of a
    kind that publishes its own (timeouts.registry: DurableTask's calls go as their tasks' own
    messages) go through it, after the others, which go as below. With tracing, in the spans of
    their dispatch (tracing.py)."""
    with tracing.dispatching(claims):
        return _publish(claims)


def _publish(claims) -> int:
    own = publishing_prefixes()
    if not own or not any(claim.biz_type.startswith(own) for claim in claims):
        return _publish_runs(claims)
    runs, by_kind = [], {}
    for claim in claims:
        kind = kind_of(claim.biz_type)
        if kind is None or kind.publish is None:
            runs.append(claim)
        else:
            by_kind.setdefault(kind.prefix, (kind, []))[1].append(claim)
    groups = list(by_kind.values())
    # What fails releases its own claims; those of the kinds not reached yet are given back too.
    try:
        sent = _publish_runs(runs) if runs else 0
    except Exception:
        release([claim for _, own_claims in groups for claim in own_claims])
        raise
    for n, (kind, own_claims) in enumerate(groups, 1):
        try:
            sent += _publish_own(kind, own_claims)
        except Exception:
            release([claim for _, later in groups[n:] for claim in later])
            raise
    return sent


def _publish_own(kind, claims) -> int:
    """Each claim's own message, made by its kind, pipelined as _publish_runs does. On an error (the
    broker's, or a fault of the database or the network while a message was made) every claim is
    released (those whose rows ended meanwhile, expired or unpublishable, stay ended): a message
    that reached the broker all the same is dropped by the worker's compare-and-set, as after any
    repeat."""
    app = current_app
    try:
        with app.producer_or_acquire() as producer, _pipelined(producer):
            for _ in kind.publish(app, claims, producer, RETRY_POLICY, ETA_HEADROOM):
                pass
    except Exception:
        logger.exception("timeouts: publishing failed; releasing %d claims of %s", len(claims), kind.label)
        release(claims)
        raise
    return len(claims)


def _publish_runs(claims) -> int:
    """Publish the claims of handlers' tasks; on a broker error, release what was not sent and re-raise.

    Claims of one queue and TTR go out together, up to RUN_BATCH_SIZE per `timeouts.run_batch` message (a
    due claim alone: a `timeouts.run` message). Messages are built and sent with the same Celery calls
    `apply_async` makes (so signals, the serializer and the broker options apply), with the routing
    worked out once per queue instead of once per message, and, on Redis with kombu 5.7+, sent in
    pipelined batches (one round trip for up to PIPELINE_SIZE messages).
    """
    app = current_app
    if app.conf.task_always_eager:
        # A host's tests often run Celery eagerly: only a task's apply_async honours that.
        for claim in claims:
            app.tasks[RUN].apply_async(args=claim.message_args(), kwargs=claim.message_kwargs())
        return len(claims)
    amqp = app.amqp
    routes = {}
    messages = list(_batches(claims, get_settings().RUN_BATCH_SIZE))
    on_time, backlog = priorities(app.conf.broker_url)
    sent = 0
    try:
        with app.producer_or_acquire() as producer, _pipelined(producer):
            for (queue, ttr, in_backlog), batch in messages:
                if queue not in routes:
                    # Routed as `timeouts.run` whatever the message, so a host's task_routes for it
                    # apply to batches too.
                    routes[queue] = amqp.router.route({"queue": queue} if queue else {}, RUN)
                # Celery kills a handler that outlives its lease, so it cannot run on beside the
                # re-dispatched attempt that lease recovery will start. A batch starts its tasks
                # within BUDGET seconds, and each start adds what is left of it to the lease.
                eta = batch[0].eta
                if len(batch) == 1 and eta is None:
                    name, args, time_limit = RUN, batch[0].message_args(), ttr
                else:  # a claim ahead goes as a batch (of one, if alone): its items carry their run_at
                    name, args, time_limit = RUN_BATCH, [[c.batch_item() for c in batch]], ttr + BUDGET
                    if eta is not None:
                        eta -= ETA_HEADROOM
                kwargs = batch[0].message_kwargs()  # the claims' shard
                message = amqp.create_task_message(uuid(), name, args, kwargs, eta=eta, time_limit=time_limit,
                                                   argsrepr=args_repr(args, amqp.argsrepr_maxsize),
                                                   kwargsrepr=repr(kwargs))
                options = routes[queue]
                priority = backlog if in_backlog else on_time
                if priority is not None:
                    options = {**options, "priority": priority}
                amqp.send_task_message(producer, name, message, retry=True, retry_policy=RETRY_POLICY,
                                       serializer="json", **options)
        # Leaving the pipeline flushed it: every message is in the broker now.
        for _ in claims:
            faults.fault("publish.after_send")  # tests: a send that worked but reports a failure
            sent += 1
    except Exception:
        # The failing messages (a whole pipelined batch) may or may not have reached the broker:
        # releasing them is still safe, because only one message per attempt can pass the worker's
        # compare-and-set.
        in_sending_order = [claim for _, batch in messages for claim in batch]
        logger.exception("timeouts: publishing failed; releasing %d unpublished claims", len(claims) - sent)
        release(in_sending_order[sent:])
        raise
    return sent


def priorities(broker_url) -> tuple[int | None, int | None]:
    """The message priorities (claimed on time, part of a backlog) on this broker; None leaves a
    message's as routed. Redis (kombu keeps a list per priority step, 0 to 9, and workers read the
    lowest number first): a backlog's go last, at 9. RabbitMQ (the higher the first, 0 by default)
    honours priorities on queues declared with x-max-priority only: there those claimed on time
    go first, at 1. Other brokers: as routed."""
    if is_redis(broker_url):
        return None, 9
    if is_amqp(broker_url):
        return 1, None
    return None, None


def args_repr(args, limit: int) -> str:
    """The message's arguments as Celery shows them (worker logs, events, Flower), cut at Celery's
    limit. Celery builds this with its saferepr unless given it, a large share of publishing's CPU
    (docs: explanation/benchmarks); our arguments are lists of numbers, strings and None, which
    plain repr() shows safely, at a fraction of the cost."""
    text = repr(args)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _batches(claims, size):
    """((queue, ttr, in a backlog), claims) for each message: consecutive claims of one queue and
    TTR (the TTR sets the message's time limit), either all part of a backlog or none (which sets
    the message's priority: a task claimed on time must not travel in a backlog's message), at most
    `size` of them, due within BATCH_WINDOW of the first unless already due (BESIDE_BACKLOG_WINDOW if
    some claims are part of a backlog). Claims come ordered by run_at, so a batch starts with its
    earliest task (which sets the message's ETA)."""
    in_backlog = [claim.claimed_at - claim.run_at > BACKLOG_AFTER for claim in claims]
    window = BESIDE_BACKLOG_WINDOW if any(in_backlog) else BATCH_WINDOW
    open_batches = {}
    for claim, claim_in_backlog in zip(claims, in_backlog, strict=True):
        handler = find_handler(claim.biz_type)  # unknown here: the default queue
        key = (handler.queue if handler is not None else None, claim.ttr, claim_in_backlog)
        batch = open_batches.get(key)
        if batch and claim.eta is not None and (claim.run_at - batch[0].run_at).total_seconds() > window:
            yield key, open_batches.pop(key)
        batch = open_batches.setdefault(key, [])
        batch.append(claim)
        if len(batch) == size:
            yield key, open_batches.pop(key)
    yield from open_batches.items()


def _pipelined(producer):
    """kombu's publish batch where the transport has one (Redis, kombu 5.7+), else send one by one.
    A batch is flushed when the block ends; an error discards what was not flushed yet."""
    batch = getattr(producer, "batch", None)
    return batch(max_size=PIPELINE_SIZE) if batch is not None else nullcontext()
