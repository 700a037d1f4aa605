"""Calls of Celery tasks kept in `timeouts_task` until they are due: the producer side of
`timeouts.celery.DurableTask` (storing a call, publishing it when it is claimed, cancelling it;
in_process.py runs a claimed one in the calling process instead).

A call is one row: biz_type `celery:<task name>` (see `biz_type_for`), biz_id the Celery task_id,
attribute the call as JSON (`store`). When the row is claimed, `publish_calls` sends the
Celery task's own message, with what Celery would have put in it, plus the row's fence in the
FENCE_HEADER header (protocol.py): the worker's DurableTask starts only the message that owns the
row's current attempt. Calls claimed together that share their publishing options travel in one
message (together.py), which the worker unpacks into each call's own request (unpacking.py).

Nothing here imports the worker side: tasks are addressed by name.
"""

import hashlib
import json
import logging
import math
import re
from datetime import datetime, timedelta
from typing import Protocol

import psycopg
from celery.utils.nodenames import anon_nodename
from celery.utils.time import maybe_make_aware
from django.db import InterfaceError as DatabaseInterfaceError
from django.db import OperationalError as DatabaseOperationalError
from django.db import connections
from kombu.exceptions import OperationalError as KombuOperationalError
from kombu.utils import json as kombu_json
from kombu.utils.uuid import uuid

from timeouts import events, validation
from timeouts.conf import get_settings
from timeouts.durable import together
from timeouts.errors import InvalidAttribute
from timeouts.protocol import FENCE_HEADER, header
from timeouts.registry import BIZ_TYPE_RE, Kind, register_kind
from timeouts.states import Status
from timeouts.storage import shards
from timeouts.store import transitions
from timeouts.store.claims import end_claim

logger = logging.getLogger(__name__)

# The biz_types of stored calls (biz_type_for): this kind's (KIND, below), no handler's.
PREFIX = "celery:"
# The attribute's format, so that a later version can read the calls an older one stored.
FORMAT = 1

# Options of apply_async that only make sense in the calling process, or that timeouts decides:
# never stored. (eta and countdown became the row's action_time; JSON is the only serializer.)
# The publishing retries are the publisher's (bounded: a scan must not hang on a broker that is down).
LOCAL_OPTIONS = frozenset({"eta", "countdown", "producer", "connection", "router", "result_cls", "publisher",
                           "add_to_parent", "serializer", "declare", "task_type", "route_name", "retry",
                           "retry_policy"})
# The keyword arguments of amqp.create_task_message that a call keeps; the rest of its options are
# routing and publishing options (queue, exchange, routing_key, priority, ...), given to the router
# and to send_task_message at publishing time, as Celery's send_task does.
MESSAGE_OPTIONS = ("group_id", "group_index", "expires", "retries", "chord", "callbacks", "errbacks", "reply_to",
                   "time_limit", "soft_time_limit", "root_id", "parent_id", "shadow", "chain", "origin",
                   "ignore_result", "replaced_task_nesting", "stamped_headers", "argsrepr", "kwargsrepr")
# new_task_id()'s tries: far more than a shard holding a single slot of shards.SLOTS needs.
MAX_TASK_ID_TRIES = 100_000
# Seconds of lease beyond a call's hard time limit: Celery kills the task at its limit, counted
# from a moment just before the compare-and-set that starts the lease.
TIME_LIMIT_MARGIN = 1


def biz_type_for(name: str) -> str:
    """`celery:<name>`: what the admin, `timeouts_stats` and the metrics show. A name that does not
    fit a biz_type (over 57 characters, or characters outside [A-Za-z0-9_.:-]) is cut and cleaned,
    and ends with 8 hex digits of its hash so that two such names stay apart; the call itself
    keeps the full name."""
    biz_type = PREFIX + name
    if BIZ_TYPE_RE.fullmatch(biz_type):
        return biz_type
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    cleaned = re.sub(r"[^A-Za-z0-9_.:-]", "_", name)[:64 - len(PREFIX) - len(digest) - 1]
    return f"{PREFIX}{cleaned}-{digest}"


# --- Storing a call (the caller's process) --------------------------------------------------------

def store(app, name, args, kwargs, task_id, eta, options, *, ttr=None):
    """Insert the call as a PENDING row due at `eta` (aware), in the caller's transaction if there
    is one. `options` are what Celery's Task.apply_async hands to send_task (the task's execution
    options merged in). Raises InvalidAttribute (a TimeoutsError) for what JSON cannot carry, or
    a call over MAX_ATTRIBUTE_BYTES, before any statement: nothing is stored. The row goes to the
    shard of its task_id (cancel() finds it there); inside the caller's transaction, a shard outside
    it raises ShardOutsideTransaction (new_task_id() picks one inside it)."""
    from timeouts.models import TimeoutTask
    from timeouts.store.scheduling import NewTask, insert

    settings = get_settings()
    call = _call(app, name, args, kwargs, task_id, options)
    try:
        text = kombu_json.dumps(call)  # Celery's JSON: datetimes, UUIDs, Decimals travel as it sends them
    except (TypeError, ValueError) as exc:
        raise InvalidAttribute(f"a call of {name} cannot be stored as JSON: {exc}") from None
    try:
        attribute = json.loads(text)
    except ValueError as exc:  # pragma: no cover - what kombu wrote, plain json reads
        raise InvalidAttribute(f"a call of {name} cannot be stored as JSON: {exc}") from None
    try:
        attribute_text = validation.attribute(attribute, settings.MAX_ATTRIBUTE_BYTES)
    except InvalidAttribute as exc:
        raise InvalidAttribute(f"a call of {name}: {exc}") from None
    time_limit = call["message"].get("time_limit")
    if ttr is None:
        ttr = math.ceil(time_limit) + TIME_LIMIT_MARGIN if time_limit else settings.DEFAULT_TTR
    new = NewTask(biz_type=biz_type_for(name), biz_id=validation.biz_id(task_id), at=_utc(eta), delay=None,
                  attribute=attribute_text, max_attempts=settings.DEFAULT_MAX_ATTEMPTS, ttr=int(ttr),
                  on_conflict=None)
    where = shards.hashed(new.biz_id)
    shards.require_transaction([where.alias], f"the call {name}[{task_id}]",
                               "leave the task_id to DurableTask, which then picks one that lands on a shard "
                               "of your transaction")
    return events.scheduled(insert(TimeoutTask, new, where, connections[where.alias]), where.alias)


def new_task_id() -> str:
    """A new Celery task_id; inside the caller's transaction, one whose row lands on a shard that
    the transaction holds (a row's shard is its task_id's hash), so that storing the call is part
    of it. Each try lands there with that shards' share of the slots."""
    held = shards.shards_in_transaction()
    task_id = uuid()
    if held:
        for _ in range(MAX_TASK_ID_TRIES):
            if shards.hashed(task_id).alias in held:
                break
            task_id = uuid()
    return task_id  # else store() refuses it, and says why


def _call(app, name, args, kwargs, task_id, options):
    """The call as send_task would turn it into a message, split into what create_task_message
    takes and what the router and send_task_message take. Absolute times only: `expires` in seconds
    counts from now, as Celery counts it, not from the publishing."""
    options = {key: value for key, value in options.items() if key not in LOCAL_OPTIONS}
    message = {key: options.pop(key) for key in MESSAGE_OPTIONS if key in options}
    message["callbacks"] = _signatures(options.pop("link", None), message.get("callbacks"))
    message["errbacks"] = _signatures(options.pop("link_error", None), message.get("errbacks"))
    for stamp in message.get("stamped_headers") or ():
        if stamp in options:
            message.setdefault("stamps", {})[stamp] = options.pop(stamp)
    expires = message.get("expires")
    if isinstance(expires, (int, float)) and not isinstance(expires, bool):
        message["expires"] = app.now() + timedelta(seconds=expires)
    if isinstance(message.get("expires"), datetime):
        message["expires"] = maybe_make_aware(message["expires"], tz=app.timezone).isoformat()
    if not message.get("root_id") or not message.get("parent_id"):
        parent = app.current_worker_task
        if parent:
            message["root_id"] = message.get("root_id") or parent.request.root_id or parent.request.id
            message["parent_id"] = message.get("parent_id") or parent.request.id
            if app.conf.task_inherit_parent_priority:
                options.setdefault("priority", (parent.request.delivery_info or {}).get("priority"))
    message["reply_to"] = message.get("reply_to") or app.thread_oid
    message["origin"] = message.get("origin") or anon_nodename()  # the caller's node, not the publisher's
    headers = {key: value for key, value in (options.pop("headers", None) or {}).items() if key != FENCE_HEADER}
    for key in ("queue", "exchange"):  # a kombu Queue or Exchange: its name
        if key in options and hasattr(options[key], "name"):
            options[key] = options[key].name
    return {"format": FORMAT, "task": name, "id": task_id, "args": list(args or ()), "kwargs": dict(kwargs or {}),
            "message": message, "headers": headers, "options": options}


def _signatures(link, given):
    """link / link_error (a signature or a list of them) as the message's callbacks / errbacks."""
    if link is None:
        return given
    links = list(link) if isinstance(link, (list, tuple)) else [link]
    return [dict(sig) for sig in links] + list(given or ())


def _utc(eta):
    return validation.action_time(at=eta)[0]


# --- Publishing claimed calls (the scan's or the dispatcher's process) ----------------------------

# Faults met while a claimed call's message is made that are not the call's: the database's (an
# expired call's end is a statement; a host's task router may read a database), the broker's (kombu
# raises its OperationalError for a connection that fails) or the network's and time-outs (OSError).
# Over once the fault is, so the call waits for a later claim, not DEAD. (Not the transport's own
# connection_errors: kombu's Redis transport counts KeyError among them.)
TRANSIENT_ERRORS = (DatabaseOperationalError, DatabaseInterfaceError, psycopg.OperationalError,
                    psycopg.InterfaceError, KombuOperationalError, OSError)


def publish_calls(app, claims, producer, retry_policy, eta_headroom):
    """Send each claimed call's own message on `producer`, yielding after each claim is dealt with
    (sent, or ended with the reason: CANCELLED if it expired, DEAD if its message can never be
    made). Calls that go out with the same publishing options travel together, in one
    `timeouts.calls` message (together.py). A fault of the database, the broker or the network met
    on the way is raised, as a broker error is: the caller gives the claims back (publishing.py),
    and the call is published at a later claim. A claim ahead of time goes with a Celery ETA
    `eta_headroom` before its run_at (protocol.ETA_HEADROOM)."""
    groups = {}
    for claim in claims:
        made = claimed_message(app, claim, eta_headroom)
        if made is None:
            yield claim
            continue
        key = together.key(made[1], made[2], due=claim.eta is None)
        group = [] if key is None else groups.setdefault(key, [])
        group.append((claim, *made))
        if key is None or len(group) == together.most(key):
            together.send(app, producer, groups.pop(key, group), retry_policy, eta_headroom)
            for sent, *_ in group:
                yield sent
    for group in groups.values():
        together.send(app, producer, group, retry_policy, eta_headroom)
        for sent, *_ in group:
            yield sent


def claimed_message(app, claim, eta_headroom):
    """The claimed call's own message, (name, message, send options); or None, its row ended with
    the reason: CANCELLED if it expired, DEAD if its message can never be made. A fault of the
    database, the broker or the network is raised."""
    try:
        call = _readable(claim)
        return None if _expired(app, claim, call) else _message(app, claim, call, eta_headroom)
    except TRANSIENT_ERRORS:
        raise
    except Exception as exc:
        # The call itself (its stored content, or a router that refuses it): given back, it
        # would fail again at every claim. An operator may requeue it once that is fixed.
        logger.exception("timeouts: the message of claimed call job %s cannot be made", claim.job_id)
        end_claim(claim.shard, claim.job_id, claim.action_time, Status.DEAD, f"its message cannot be made: {exc!r}")
        return None


def run_in_process(claim) -> bool:
    """The claimed call, run in this process as a worker runs its message (in_process.py)."""
    from timeouts.durable import in_process

    return in_process.run(claim)


# The Request class of DurableTask (its `Request`): the worker's main process starts a call claimed
# ahead while its message waits for its eta (starts.py). Named, not imported: nothing here loads
# the worker side.
REQUEST_CLASS = "timeouts.durable.starts.StartingRequest"
# Claimed calls come with their attribute, and go as their tasks' own messages.
KIND = register_kind(Kind(PREFIX, "DurableTask", "the Celery calls that timeouts.celery.DurableTask stores",
                          claim_returns_attribute=True, publish=publish_calls, run_in_process=run_in_process,
                          request_class=REQUEST_CLASS))


def _readable(claim) -> dict:
    """The stored call, back to what Celery's JSON serializer read (datetimes, UUIDs and Decimals
    as given), if this version can make its message."""
    call = kombu_json.loads(_json_text(claim.call))
    found = call.get("format") if isinstance(call, dict) else None
    if found != FORMAT:
        raise ValueError(f"a call stored in format {found!r}: this version reads format {FORMAT}")
    return call


def _json_text(attribute) -> str:
    return attribute if isinstance(attribute, str) else json.dumps(attribute)


def _expired(app, claim, call) -> bool:
    expires = call["message"].get("expires")
    if not expires:
        return False
    expires_at = datetime.fromisoformat(expires) if isinstance(expires, str) else expires
    if maybe_make_aware(expires_at, tz=app.timezone) > app.now():
        return False
    error = f"expired at {expires_at.isoformat()} before it was due: not run"
    ended = end_claim(claim.shard, claim.job_id, claim.action_time, Status.CANCELLED, error)
    logger.warning("timeouts: %s[%s] %s", call["task"], call["id"], error)
    if ended and not call["message"].get("ignore_result"):
        try:  # what a Celery worker records for an expired message
            app.backend.mark_as_revoked(call["id"], "expired")
        except Exception:
            logger.exception("timeouts: could not record %s[%s] as revoked", call["task"], call["id"])
    return True


def _message(app, claim, call, eta_headroom):
    """What send_task makes after its checks, with the task_id, arguments and options of the call,
    no ETA unless the claim is ahead of time, and the fence: (name, message, send options)."""
    amqp = app.amqp
    name, args, kwargs = call["task"], call["args"], call["kwargs"]
    options = dict(call["options"])
    options["headers"] = {**call["headers"], FENCE_HEADER: header(claim.fence)}
    message_options = dict(call["message"])
    for stamp, value in (message_options.pop("stamps", None) or {}).items():
        options[stamp] = value
    options = amqp.router.route(options, name, args, kwargs, app._tasks.get(name))
    expires = message_options.get("expires")
    if expires:
        remaining = (maybe_make_aware(datetime.fromisoformat(expires), tz=app.timezone) - app.now()).total_seconds()
        options["expiration"] = max(remaining, 0)
    message = amqp.create_task_message(
        call["id"], name, args, kwargs, None, claim.eta and claim.eta - eta_headroom,
        create_sent_event=app.conf.task_send_sent_event,
        **message_options, **options)
    for stamp in message_options.get("stamped_headers") or ():
        options.pop(stamp, None)
    return name, message, options


# --- Cancelling -----------------------------------------------------------------------------------

class _Identified(Protocol):
    """What carries a task_id: Celery's AsyncResult."""

    @property
    def id(self) -> str: ...


def cancel(task_id: str | _Identified) -> bool:
    """Cancel every call of `task_id` (a Celery task_id, or its AsyncResult) still waiting; True
    means none of them will ever start. Inside `transaction.atomic()` the cancel is part of that
    transaction."""
    if not isinstance(task_id, str):
        task_id = getattr(task_id, "id", task_id)  # an AsyncResult
    task_id = validation.biz_id(task_id)
    return transitions.cancel_call(task_id, PREFIX, shards.hashed(task_id).alias)
