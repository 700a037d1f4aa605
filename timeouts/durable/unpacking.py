"""The worker's side of a `timeouts.calls` message (together.py): each call it carries becomes an
ordinary request of the call's own task.

`unpack` is the Strategy of the `timeouts.calls` task (Celery's `Task.Strategy` hook: the consumer
hands it each message of that task). For each item it does what Celery's default strategy
(celery.worker.strategy.default) does for a message of the call's own: a Request of the call's task
(DurableTask's StartingRequest, which starts the call ahead while it waits: starts.py), with its own
task_id, the `task_received` signal and the `task-received` event, the revoked and expired checks;
then, at the call's ETA, the request goes to the pool as Celery's timer hands an ETA message on
(or at once when it has none, through the task's rate limit if it has one). So each call runs, is
traced, signalled, recorded in the result backend and followed by its links as a message of its
own would be. What differs is what the broker sees: one message, and one acknowledgement.

Calls of one message that share an ETA share one timer entry; the message counts once against the
worker's prefetch while they wait, as a message with an ETA does. It is acknowledged once every call
has been (a call acknowledges when Celery would acknowledge its own message: when a pool process
takes it, or after it ran for `acks_late`), or rejected and requeued once every call has been dealt
with if one asked for that (reject_on_worker_lost): the calls that ran meanwhile are then dropped
by their fence when the message comes back. A worker that dies before then leaves the message
unacknowledged: the broker delivers it again, and the calls' rows, whose leases run out, are
published again; whichever message comes first runs each call once its fence allows, and the others
are dropped by it.
"""

import logging
import threading

from celery import shared_task, signals
from celery.app import trace as app_trace
from celery.exceptions import InvalidTaskError
from celery.utils.imports import symbol_by_name
from celery.utils.time import timezone
from celery.worker.request import create_request_cls
from celery.worker.state import task_reserved, task_scheduled
from kombu.asynchronous.timer import to_timestamp

from timeouts.protocol import CALLS, from_call_item

logger = logging.getLogger(__name__)

# Calls whose ETAs are this close share one timer entry, at the first one's: a pool process that
# gets a call this much before its ETA waits for its run_at (durable/attempt.py), never starts early.
SAME_ETA = 0.001  # seconds


class _Acks:
    """The carrier message's acknowledgement, once all its calls have been acknowledged or rejected."""

    def __init__(self, ack, reject, left):
        self.ack, self.reject, self.left = ack, reject, left
        self.requeue = False
        self.lock = threading.Lock()

    def one(self, requeue, log, errors):
        with self.lock:
            self.left -= 1
            self.requeue = self.requeue or requeue
            last = self.left == 0
        if last:
            if self.requeue:
                self.reject(log, errors, True)
            else:
                self.ack(log, errors)


class CarriedMessage:
    """One call of a carrier, as Celery's Request and consumer read a message: its own headers,
    properties and (decoded) body, the carrier's delivery_info; its ack and reject count towards the
    carrier's."""

    __slots__ = ("headers", "properties", "body", "delivery_info", "_acks")
    content_type = content_encoding = None  # the body is decoded

    def __init__(self, headers, properties, body, delivery_info, acks):
        self.headers, self.properties, self.body = headers, properties, body
        self.delivery_info, self._acks = delivery_info, acks

    @property
    def payload(self):
        return self.body

    def ack_log_error(self, log, errors):
        self._acks.one(False, log, errors)

    def reject_log_error(self, log, errors, requeue=False):
        self._acks.one(requeue, log, errors)


def unpack(task, app, consumer, **kwargs):
    """The Strategy of `timeouts.calls`: a handler of its messages, as Celery's default strategy is
    of a task's."""
    hostname = consumer.hostname
    connection_errors = consumer.connection_errors
    eventer = consumer.event_dispatcher
    events = bool(eventer and eventer.enabled)
    call_at = consumer.timer.call_at
    handle = consumer.on_task_request
    limit_task = consumer._limit_task
    rate_limits = not consumer.disable_rate_limits
    buckets = consumer.task_buckets
    revoked_tasks = consumer.controller.state.revoked
    utc = app.uses_utc_timezone()
    does_info = logger.isEnabledFor(logging.INFO)
    request_classes = {}

    def request_class(called):
        made = request_classes.get(called.name)
        if made is None:
            made = request_classes[called.name] = create_request_cls(symbol_by_name(called.Request), called,
                                                                     consumer.pool, hostname, eventer, app=app)
        return made

    def hand_on(request):
        """What Celery does with a request that is due (strategy.default, Consumer.apply_eta_task)."""
        bucket = buckets[request.task.name] if rate_limits else None
        if bucket:
            limit_task(request, bucket, 1)
        else:
            task_reserved(request)
            handle(request)

    def fire(requests, waiting):
        for request in requests:
            hand_on(request)
        waiting[0] -= 1
        if not waiting[0]:
            consumer.qos.decrement_eventually()

    def received(message, item, delivery_info, acks):
        """The call's request, received as Celery's default strategy receives a message; None if
        it goes no further (revoked, expired, or not a call the worker can run: said and dealt with)."""
        try:
            headers, properties, body = from_call_item(item)
        except ValueError as exc:
            consumer.on_invalid_task(None, CarriedMessage({}, {}, [item], delivery_info, acks), InvalidTaskError(exc))
            return None
        carried = CarriedMessage(headers, properties, body, delivery_info, acks)
        called = app.tasks.get(headers.get("task"))
        if called is None:
            consumer.on_unknown_task(body, carried, KeyError(headers.get("task")))
            return None
        try:
            request = request_class(called)(
                carried, on_ack=carried.ack_log_error, on_reject=carried.reject_log_error, app=app,
                hostname=hostname, eventer=eventer, task=called, connection_errors=connection_errors,
                body=body, headers=headers, decoded=True, utc=utc)
        except Exception as exc:  # noqa: BLE001 - one call's bad message must not stop the worker, nor its siblings
            consumer.on_invalid_task(body, carried, exc)
            return None
        if does_info:
            context = {"id": request.id, "name": request.name, "args": request.argsrepr,
                       "kwargs": request.kwargsrepr, "eta": request.eta}
            logger.info(app_trace.LOG_RECEIVED, context, extra={"data": context})
        if (request.expires or request.id in revoked_tasks) and request.revoked():
            return None
        signals.task_received.send(sender=consumer, request=request)
        if events and called.send_events:
            eventer.send("task-received", uuid=request.id, name=request.name, args=request.argsrepr,
                         kwargs=request.kwargsrepr, root_id=request.root_id, parent_id=request.parent_id,
                         retries=request.request_dict.get("retries", 0),
                         eta=request.eta and request.eta.isoformat(),
                         expires=request.expires and request.expires.isoformat())
        return request

    def handler(message, body, ack, reject, callbacks, **_):
        try:
            (items,), _, _ = message.payload
        except (TypeError, ValueError):
            raise InvalidTaskError(f"a {task.name} message without its list of calls") from None
        delivery_info = message.delivery_info
        acks = _Acks(ack, reject, len(items))
        if not items:
            ack(logger, connection_errors)
            return
        due, later = [], []
        for item in items:
            request = received(message, item, delivery_info, acks)
            if request is None:
                continue
            eta = request.eta and _timestamp(app, request)
            if eta is False:
                continue
            if eta:
                later.append((eta, request))
            else:
                due.append(request)
        for request in due:
            if callbacks:
                for callback in callbacks:
                    callback(request)
            hand_on(request)
        if not later:
            return
        later.sort(key=lambda pair: pair[0])
        entries = []  # (eta, requests) of each timer entry
        for eta, request in later:
            if entries and eta - entries[-1][0] <= SAME_ETA:
                entries[-1][1].append(request)
            else:
                entries.append((eta, [request]))
        waiting = [len(entries)]
        consumer.qos.increment_eventually()  # set up after the strategies
        for eta, requests in entries:
            entry = call_at(eta, fire, (requests, waiting), priority=6)
            for request in requests:
                request._eta_timer_entry = entry
                task_scheduled(request)

    return handler


def _timestamp(app, request):
    """The request's ETA on the worker's timer clock, as Celery's default strategy reckons it; False
    for one it cannot reckon, which fails the call as Celery fails such a message."""
    try:
        if request.utc:
            return to_timestamp(timezone.to_system(request.eta))
        return to_timestamp(request.eta, app.timezone)
    except (OverflowError, ValueError) as exc:
        logger.error("Couldn't convert ETA %r to timestamp: %r. Task: %r", request.eta, exc,
                     request.info(safe=True), exc_info=True)
        request.task.backend.mark_as_failure(request.id, exc, request=request._context,
                                             store_result=request.store_errors)
        request.reject(requeue=False)
        return False


# The task whose messages carry stored calls claimed together (together.py). The worker never runs
# its body: its Strategy, unpack above (named, since a function set on the task class would be bound
# to it), turns each message into ordinary requests of the calls' own tasks, and acknowledges it once
# they all are. timeouts.celery imports this module, so every worker of a project that uses
# DurableTask knows the task.
@shared_task(name=CALLS, bind=True, ignore_result=True, Strategy=f"{__name__}:unpack")
def calls(self, items):
    raise RuntimeError(f"{CALLS} carries calls for a Celery worker to unpack; it does not run as a task")
