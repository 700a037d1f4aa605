"""Kinds of work: the families of biz_types that timeouts' extensions add beside the handlers' own
(timeouts.durable: stored Celery calls; timeouts.backends: tasks of Django's tasks framework), each
under a biz_type prefix of its own.

The core names none of them: it asks a biz_type's kind whether a handler may take the name
(registry.handler), whether cancel(), limits() and the others accept it (registry.check_known),
whether the claim returns the row's attribute, how its claims are published
(dispatch/publishing.py) and run in the calling process (timeouts.testing), which Celery Request
class its messages run through in a worker (worker/priority.py), and which of its biz_types this
process knows (the admin's filter, the businesses page, timeouts_stats). An extension registers
its kind when its module loads; the AppConfig loads timeouts' own before it discovers the
project's handlers.
"""

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from timeouts.validation import BIZ_TYPE_RE


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
# The biz_types of each kind that this process knows (note()), by label.
_noted: dict[str, set[str]] = {}
# Derived from _kinds on each change: the claim and publish() read them for every claim.
_attribute_prefixes: list[str] = []
_publishing_prefixes: tuple[str, ...] = ()


# The biz_types handlers are registered for. The registry, which asks this module about kinds, sets
# it when it loads: this module stays below it.
handler_names: Callable[[], Iterable[str]] = tuple


def register(kind: Kind) -> Kind:
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
        taken = sorted(biz_type for biz_type in handler_names() if biz_type.startswith(kind.prefix))
        if taken:
            raise ImproperlyConfigured(
                f"kind {kind.label!r}: biz_types starting with {kind.prefix!r} are {kind.description}, but "
                f"handlers are registered for {', '.join(map(repr, taken))}")
    _kinds[kind.prefix] = kind
    _noted.setdefault(kind.label, set())
    _derive()
    return kind


def unregister(kind: Kind):
    """Forget a kind and the biz_types noted of it (for tests)."""
    if _kinds.get(kind.prefix) == kind:
        del _kinds[kind.prefix]
        _noted.pop(kind.label, None)
        _derive()


def _derive():
    global _attribute_prefixes, _publishing_prefixes
    _attribute_prefixes = [kind.prefix for kind in _kinds.values() if kind.claim_returns_attribute]
    _publishing_prefixes = tuple(kind.prefix for kind in _kinds.values() if kind.publish is not None)


def of(biz_type: str) -> Kind | None:
    """The kind of `biz_type`; None: a handler's (or nobody's)."""
    for prefix, kind in _kinds.items():
        if biz_type.startswith(prefix):
            return kind
    return None


def registered() -> dict[str, Kind]:
    """The kinds, by prefix."""
    return dict(_kinds)


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


def note(biz_type: str):
    """Note a biz_type of a kind that this process knows (a DurableTask bound to a Celery app):
    the admin's filter offers it and the businesses page lists it before it has any task."""
    kind = of(biz_type)
    if kind is None:
        raise ValueError(f"{biz_type!r} is of no registered kind")
    _noted[kind.label].add(biz_type)


def noted() -> dict[str, frozenset[str]]:
    """The biz_types note() was given, by their kind's label."""
    return {label: frozenset(biz_types) for label, biz_types in _noted.items()}
