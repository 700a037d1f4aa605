"""Stored calls claimed together travel in one message when they share their routing.

A claim publishes every call due within a part of the dispatcher's lead at once. Each message
costs the worker's main process a delivery, an acknowledgement (a round trip to the broker) and
Celery's bookkeeping of a message that waits for its ETA, whatever its body; and the dispatcher a
publish. So the calls of one claim whose messages would go out with the same publishing options
(queue, exchange, routing key, priority and the rest) travel in one `timeouts.calls` message
(protocol.CALLS): its list holds each call's own message, made as for a message of its own, its
fence included. The worker unpacks it into an ordinary request of each call's own task
(unpacking.py), and acknowledges the message once all of them are.

A call alone goes as its own message, as does a call whose message sends a `task-sent` event
(task_send_sent_event): that event is the call's own, and Celery sends it for a message it publishes.
"""

from celery import signals
from kombu.utils.uuid import uuid

from timeouts.protocol import CALLS, call_item

# The most calls in one message claimed ahead: bounds its size. A worker holds the messages that
# wait for their ETA whatever its prefetch, one call a message or many.
MAX_CALLS = 100
# The most calls in one message of calls already due (a backlog, a scan's claim). A worker's
# prefetch counts messages: it takes this many times as many calls at once, which wait there for
# a process while other workers may be idle, and whose leases run meanwhile.
MAX_DUE_CALLS = 10
# The keyword arguments of Celery's send_task_message that are not broker properties of the message.
NOT_PROPERTIES = frozenset({"exchange", "routing_key", "queue", "event_dispatcher", "retry", "retry_policy",
                            "serializer", "delivery_mode", "compression", "declare", "headers", "exchange_type",
                            "timeout", "confirm_timeout"})


def key(message, options, due=False):
    """What calls must share to travel together: every publishing option but their own headers, and
    whether they are due already (`due`: claimed without an ETA). None for a call that goes alone."""
    if message.sent_event is not None:
        return None
    return (due, *sorted((name, _comparable(value)) for name, value in options.items() if name != "headers"))


def most(key) -> int:
    """The most calls of one message of `key`."""
    return MAX_DUE_CALLS if key[0] else MAX_CALLS


def _comparable(value):
    """A routing option as a key can hold it: a kombu Queue or Exchange by its repr (name and
    bindings)."""
    return value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)


def send(app, producer, made, retry_policy, eta_headroom):
    """Send the calls `made` ((claim, name, message, options), of one key) on `producer`: one alone as
    its own message, several as one `timeouts.calls` message."""
    amqp = app.amqp
    if len(made) == 1:
        _, name, message, options = made[0]
        amqp.send_task_message(producer, name, message, serializer="json", retry=True, retry_policy=retry_policy,
                               **options)
        return
    options = {name: value for name, value in made[0][3].items() if name != "headers"}
    extra_properties = {name: value for name, value in options.items() if name not in NOT_PROPERTIES}
    items, published = [], []
    for _, name, message, own in made:
        headers = {**message.headers, **(own.get("headers") or {})}  # as send_task_message merges them
        properties = {**message.properties, **extra_properties}
        items.append(call_item(headers, properties, list(message.body)))
        published.append((name, headers, properties, message.body))
    etas = [claim.eta for claim, *_ in made]
    eta = None if None in etas else min(etas) - eta_headroom
    carrier = amqp.create_task_message(uuid(), CALLS, [items], {}, eta=eta, argsrepr=f"[<{len(items)} calls>]",
                                       kwargsrepr="{}")
    exchange, routing_key = options.get("exchange"), options.get("routing_key")
    if signals.before_task_publish.receivers:  # each call's own, as Celery sends it for its message
        for name, headers, properties, body in published:
            signals.before_task_publish.send(sender=name, body=body, exchange=exchange, routing_key=routing_key,
                                             declare=None, headers=headers, properties=properties,
                                             retry_policy=retry_policy)
    amqp.send_task_message(producer, CALLS, carrier, serializer="json", retry=True, retry_policy=retry_policy,
                           **options)
    if signals.after_task_publish.receivers:
        for name, headers, _, body in published:
            signals.after_task_publish.send(sender=name, body=body, headers=headers, exchange=exchange,
                                            routing_key=routing_key)
