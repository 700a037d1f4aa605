"""Who owns each biz_type: a handler, registered by name (the `@timeouts.handler` decorator and the
lookup the runtime uses), or a kind of work, the family of biz_types that one of timeouts'
extensions adds under a prefix of its own (timeouts.durable: stored Celery calls; timeouts.backends:
tasks of Django's tasks framework). A biz_type has one owner.

The core names no extension: it asks a biz_type's kind whether a handler may take the name
(handler()), whether cancel(), limits() and the others accept it (check_known()), whether the claim
returns the row's attribute, how its claims are published (dispatch/publishing.py) and run in the
calling process (timeouts.testing), which Celery Request class its messages run through in a worker
(worker/priority.py), and which of its biz_types this process knows (the admin's filter, the
businesses page, timeouts_stats). An extension registers its kind when its module loads; the
AppConfig loads timeouts' own before it discovers the project's handlers.
"""

import functools
import inspect
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from asgiref.sync import async_to_sync
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from timeouts.errors import InvalidBizType, UnknownBizType
from timeouts.validation import BIZ_TYPE_RE, check_concurrency, check_lateness_policy, check_rate_limit, describe

# --- Handlers --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Handler:
    biz_type: str
    func: Callable
    queue: str | None = None
    max_attempts: int | None = None  # None: the DEFAULT_MAX_ATTEMPTS setting
    ttr: int | None = None  # None: the DEFAULT_TTR setting
    rate_limit: float | None = None  # handler starts per second, deployment-wide (timeouts.limiting.controls)
    concurrency: int | None = None  # tasks running at once, deployment-wide
    max_lateness: timedelta | None = None  # how late an attempt may start (limiting/lateness.py); None: no limit
    on_late: str = "run"  # what becomes of a later start: "run", "skip" or "dead"

    def __call__(self, task):
        result = self.func(task)
        if isinstance(result, Coroutine):
            # An async handler (async def, a partial of one, an object whose __call__ is async, or a
            # wrapper that returns the coroutine): its body runs only once awaited. It is awaited
            # to its end here, as Django's tasks framework runs an async task: on an event loop of
            # its own, while sync_to_async() calls in it (Django's async ORM) come back to this
            # thread and its database connections, which the worker cleans up after each message.
            return async_to_sync(_awaited)(result)
        return result


async def _awaited(coroutine):
    return await coroutine


# A handler function, whatever its signature: @timeouts.handler gives it back unchanged.
HandlerFunc = TypeVar("HandlerFunc", bound=Callable[..., Any])

_handlers: dict[str, Handler] = {}


def check_biz_type(biz_type) -> str:
    if not isinstance(biz_type, str) or not BIZ_TYPE_RE.fullmatch(biz_type):
        raise InvalidBizType(f"biz_type must be 1 to 64 characters of [A-Za-z0-9_.:-], got {describe(biz_type)}")
    return biz_type


def handler(biz_type: str, *, queue: str | None = None, max_attempts: int | None = None, ttr: int | None = None,
            rate_limit: float | None = None, concurrency: int | None = None,
            max_lateness: timedelta | None = None, on_late: str = "run",
            ) -> Callable[[HandlerFunc], HandlerFunc]:
    """Register the decorated function as the handler of `biz_type`.

    The function receives the `TimeoutTask` (status RUNNING). Returning marks it DONE; raising
    retries it with backoff, and after `max_attempts` attempts it becomes DEAD.

    `rate_limit` (starts per second) and `concurrency` (tasks running at once) limit this biz_type
    across the whole deployment (timeouts.limiting.controls); `timeouts.set_limits()` overrides them at run time.

    `max_lateness` (a timedelta) and `on_late` are the lateness policy (timeouts.limiting.lateness):
    an attempt that starts more than `max_lateness` after it was due is run all the same ("run", the
    default), skipped ("skip": the task ends CANCELLED) or made DEAD ("dead"). `set_limits()`
    overrides them too.

    The function may be an `async def`: the worker awaits it to its end, as Django runs an async task.

    A bad registration (name, option, a second handler for one biz_type, or a function whose call
    would not run its body) raises ImproperlyConfigured, at import time: the project is
    misconfigured, not a user's input.
    """
    if callable(biz_type) and not isinstance(biz_type, str):
        raise ImproperlyConfigured(
            f"@timeouts.handler needs the biz_type that {_qualified(biz_type)} handles: "
            f'use @timeouts.handler("name"), not a bare @timeouts.handler')
    if not isinstance(biz_type, str) or not BIZ_TYPE_RE.fullmatch(biz_type):
        raise ImproperlyConfigured(
            f"@timeouts.handler: biz_type must be 1 to 64 characters of [A-Za-z0-9_.:-], got {describe(biz_type)}")
    kind = kind_of(biz_type)
    if kind is not None:
        raise ImproperlyConfigured(
            f"@timeouts.handler: biz_types starting with {kind.prefix!r} are {kind.description}, got {biz_type!r}")
    for name, value in (("max_attempts", max_attempts), ("ttr", ttr)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ImproperlyConfigured(f"handler {biz_type!r}: {name} must be a positive integer, got {value!r}")
    if queue is not None and (not isinstance(queue, str) or not queue):
        raise ImproperlyConfigured(f"handler {biz_type!r}: queue must be a non-empty string, got {queue!r}")
    rate_limit, concurrency = _limits(biz_type, rate_limit, concurrency)
    max_lateness, on_late = check_lateness_policy(
        max_lateness, on_late, lambda message: ImproperlyConfigured(f"handler {biz_type!r}: {message}"))

    def register(func: HandlerFunc) -> HandlerFunc:
        _check_runnable(biz_type, func)
        new = Handler(biz_type, func, queue, max_attempts, ttr, rate_limit, concurrency, max_lateness, on_late)
        old = _handlers.get(biz_type)
        # Re-importing the same module (autoreload, tests) re-registers the same function: allowed.
        if old is not None and _qualified(old.func) != _qualified(func):
            raise ImproperlyConfigured(
                f"biz_type {biz_type!r} already has a handler: {_qualified(old.func)}; "
                f"refusing to replace it with {_qualified(func)}"
            )
        _handlers[biz_type] = new
        return func

    return register


def _limits(biz_type, rate_limit, concurrency):
    def misconfigured(message):
        return ImproperlyConfigured(f"handler {biz_type!r}: {message}")

    return check_rate_limit(rate_limit, misconfigured), check_concurrency(concurrency, misconfigured)


def _check_runnable(biz_type, func):
    """Refuse what the worker cannot run: a call of a generator function returns a generator and
    runs none of its body, so the task would be DONE without having run."""
    if not callable(func):
        raise ImproperlyConfigured(
            f"handler {biz_type!r}: {describe(func)} is not callable; decorate a function (def or async def)")
    called = _called(func)
    if inspect.isasyncgenfunction(called):
        raise ImproperlyConfigured(
            f"handler {biz_type!r}: {_qualified(func)} is an async generator function, whose call runs none "
            f"of its body; write an async def without yield")
    if inspect.isgeneratorfunction(called):
        raise ImproperlyConfigured(
            f"handler {biz_type!r}: {_qualified(func)} is a generator function, whose call runs none of "
            f"its body; write a def (or async def) without yield")


def _called(func):
    """The function a call of `func` runs: through functools.partial, and a callable object's __call__."""
    while isinstance(func, functools.partial):
        func = func.func
    if inspect.isroutine(func) or inspect.isclass(func):
        return func
    return func.__call__


def _qualified(func):
    """module.name of a function, of a partial's function, or of a callable object's class."""
    while isinstance(func, functools.partial):
        func = func.func
    if not (inspect.isroutine(func) or inspect.isclass(func)):
        func = type(func)
    return f"{getattr(func, '__module__', None)}.{getattr(func, '__qualname__', repr(func))}"


def register_internal(handler: Handler):
    """Register a handler of a kind's, under a biz_type of that kind, which @timeouts.handler refuses."""
    _handlers[handler.biz_type] = handler


def get_handler(biz_type) -> Handler:
    try:
        return _handlers[biz_type]
    except (KeyError, TypeError):
        check_biz_type(biz_type)
        raise _unknown(biz_type) from None


def check_known(biz_type) -> str:
    """`biz_type` if this deployment has tasks of it, else InvalidBizType or UnknownBizType: what
    cancel(), limits() and the others accept. Known: a handler's biz_type, and every biz_type of a
    kind of work, whose biz_types this process need not all know: any Celery task may be
    stored by DurableTask, bound here or not, and a tasks backend of any alias and queue stores its
    tasks."""
    check_biz_type(biz_type)
    if not is_known(biz_type):
        raise _unknown(biz_type)
    return biz_type


def is_known(biz_type: str) -> bool:
    """check_known()'s rule, for a valid biz_type."""
    return biz_type in _handlers or kind_of(biz_type) is not None


def _unknown(biz_type) -> UnknownBizType:
    return UnknownBizType(f"no handler is registered for biz_type {biz_type!r}; "
                          f"known: {', '.join(sorted(_handlers)) or 'none'}")


def find_handler(biz_type) -> Handler | None:
    """The handler of biz_type, or None if this process does not know it."""
    return _handlers.get(biz_type)


def registered() -> dict[str, Handler]:
    return dict(_handlers)


def unregister(biz_type):
    """Forget a handler (for tests and for hosts that swap handlers at run time)."""
    _handlers.pop(biz_type, None)


# --- Kinds of work: the biz_types an extension owns, by prefix -------------------------------------

@dataclass(frozen=True)
class Kind:
    # Every biz_type that starts with it is of this kind, and no handler's.
    prefix: str
    # How the admin, the businesses page and timeouts_stats name where its biz_types come from.
    label: str
    # What its biz_types are, for the refusal of a handler that would take one.
    description: str
    # The claim returns each row's attribute (Claim.call), which `publish` makes its message of.
    claim_returns_attribute: bool = False
    # publish(app, claims, producer, retry_policy, eta_headroom): sends each claim's message on
    # `producer` and yields each claim once dealt with, raising a fault of the broker, the database
    # or the network (the caller then gives every claim back). None: the claims run as handlers'
    # tasks do, in `timeouts.run` messages.
    publish: Callable[..., Iterator] | None = None
    # The Celery Request class of the messages `publish` sends, as a dotted path (a Task's `Request`
    # takes the same), or None: they run as timeouts.run. A prefork worker hands those that carry
    # an ETA (claimed on time) to a free process before a backlog's (worker/priority.py). A path,
    # so that registering the kind loads nothing of Celery's worker where no worker runs.
    request_class: str | None = None
    # run_in_process(claim): runs a claimed row in the calling process, on its connection and in its
    # transaction, as a worker would (timeouts.testing.run_due); True if the work started. None:
    # the claim runs as a handler's task does.
    run_in_process: Callable[..., bool] | None = None


_kinds: dict[str, Kind] = {}  # by prefix
# The biz_types of each kind that this process knows (note_of_kind()), by label.
_noted: dict[str, set[str]] = {}
# Derived from _kinds on each change: the claim and publish() read them for every claim.
_attribute_prefixes: list[str] = []
_publishing_prefixes: tuple[str, ...] = ()


def register_kind(kind: Kind) -> Kind:
    """Add `kind`, at import time of the module that defines it. The same kind again (its module
    imported again) replaces it; a prefix that overlaps another kind's, or that a registered
    handler's biz_type starts with, raises ImproperlyConfigured: a biz_type has one owner."""
    if not isinstance(kind.prefix, str) or not BIZ_TYPE_RE.fullmatch(kind.prefix) or len(kind.prefix) > 32:
        raise ImproperlyConfigured(
            f"kind {kind.label!r}: its prefix must be 1 to 32 characters of [A-Za-z0-9_.:-], got {kind.prefix!r}")
    old = _kinds.get(kind.prefix)
    if old is None or old.label != kind.label:
        for other in _kinds.values():
            if other.prefix.startswith(kind.prefix) or kind.prefix.startswith(other.prefix):
                raise ImproperlyConfigured(
                    f"kind {kind.label!r}: its prefix {kind.prefix!r} overlaps the prefix {other.prefix!r} of "
                    f"the kind {other.label!r}")
        if kind.label in _noted:
            raise ImproperlyConfigured(f"a kind is already labelled {kind.label!r}")
        taken = sorted(biz_type for biz_type in _handlers if biz_type.startswith(kind.prefix))
        if taken:
            raise ImproperlyConfigured(
                f"kind {kind.label!r}: biz_types starting with {kind.prefix!r} are {kind.description}, but "
                f"handlers are registered for {', '.join(map(repr, taken))}")
    _kinds[kind.prefix] = kind
    _noted.setdefault(kind.label, set())
    _derive()
    return kind


def unregister_kind(kind: Kind):
    """Forget a kind and the biz_types noted of it (for tests)."""
    if _kinds.get(kind.prefix) == kind:
        del _kinds[kind.prefix]
        _noted.pop(kind.label, None)
        _derive()


def _derive():
    global _attribute_prefixes, _publishing_prefixes
    _attribute_prefixes = [kind.prefix for kind in _kinds.values() if kind.claim_returns_attribute]
    _publishing_prefixes = tuple(kind.prefix for kind in _kinds.values() if kind.publish is not None)


def kind_of(biz_type: str) -> Kind | None:
    """The kind of `biz_type`; None: a handler's (or nobody's)."""
    for prefix, kind in _kinds.items():
        if biz_type.startswith(prefix):
            return kind
    return None


def attribute_prefixes() -> list[str]:
    """The prefixes of the kinds whose claims come with their rows' attribute: a parameter of the
    claim (claim_due), which returns no other row's."""
    return _attribute_prefixes


def publishing_prefixes() -> tuple[str, ...]:
    """The prefixes of the kinds that publish their claims themselves, for str.startswith()."""
    return _publishing_prefixes


def request_classes() -> tuple[type, ...]:
    """The Request classes the kinds name, imported now: in a worker, which runs their messages."""
    return tuple(import_string(kind.request_class) for kind in _kinds.values() if kind.request_class)


def note_of_kind(biz_type: str):
    """Note a biz_type of a kind that this process knows (a DurableTask bound to a Celery app):
    the admin's filter offers it and the businesses page lists it before it has any task."""
    kind = kind_of(biz_type)
    if kind is None:
        raise ValueError(f"{biz_type!r} is of no registered kind")
    _noted[kind.label].add(biz_type)


def noted_of_kinds() -> dict[str, frozenset[str]]:
    """The biz_types note_of_kind() was given, by their kind's label."""
    return {label: frozenset(biz_types) for label, biz_types in _noted.items()}
