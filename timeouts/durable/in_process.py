"""A claimed Celery call run in the calling process, as a worker runs its message: how
timeouts.testing.run_due runs a DurableTask call, inside the caller's transaction.

The call's own message is made as the publisher makes it (calls.claimed_message: its task_id,
args, kwargs, headers and links, and the row's fence), then traced as a worker traces a message it
receives: the task's request holds the message's fields, so DurableTask starts the attempt through
its fence and records its ending on the row (durable/attempt.py). Task.apply() would run the same
task_id, args and kwargs, but as an eager request: a `self.retry(countdown=...)` would then run
again at once, and with the message's fence, which the first attempt has used. Here the request
is a worker's, so a retry goes the durable way, a row of its own with the same task_id. As for
apply(), no result is stored and an error is not raised: the row records it, and Celery logs it.
A call due after the database clock (run_due's `until` ahead of it) has its start recorded ahead
(attempt.start_now), as a worker's main process records one, and runs at once.
"""

from celery import current_app
from celery.app.trace import build_tracer
from celery.utils.nodenames import anon_nodename

from timeouts.durable import calls
from timeouts.protocol import ETA_HEADROOM, FENCE_HEADER, header
from timeouts.store import attempts
from timeouts.worker import attempt


def run(claim) -> bool:
    """Run the claimed call; True if its attempt started, False if it expired or its message cannot
    be made (calls.claimed_message ended its row)."""
    app = current_app
    made = calls.claimed_message(app, claim, ETA_HEADROOM)
    if made is None:
        return False
    fence = attempt.start_now(claim.fence, claim.claimed_at)  # due later than the clock: started ahead
    if fence is None:
        return False
    name, message, options = made
    options["headers"][FENCE_HEADER] = header(fence)
    headers = {**message.headers, **options["headers"]}  # as send_task_message merges them
    args, kwargs, embed = message.body
    request = {**headers, **(embed or {}), "args": args, "kwargs": kwargs, "is_eager": False,
               "hostname": anon_nodename(), "delivery_info": _delivery_info(options),
               "properties": message.properties, "reply_to": message.properties.get("reply_to"),
               "correlation_id": message.properties.get("correlation_id")}
    tracer = build_tracer(name, app.tasks[name], eager=True, propagate=False, app=app)
    tracer(headers["id"], args, kwargs, request)
    state = attempts.state(claim.fence.key)
    return state is not None and state["attempts"] >= claim.attempt


def _delivery_info(options) -> dict:
    """Where the message would have come from: its exchange and routing key, as routed. A retry is
    sent there again (Task.signature_from_request)."""
    queue = options.get("queue")
    exchange = options.get("exchange") or getattr(queue, "exchange", None)
    return {"exchange": getattr(exchange, "name", exchange),
            "routing_key": options.get("routing_key") or getattr(queue, "routing_key", None),
            "priority": options.get("priority"), "redelivered": False}
