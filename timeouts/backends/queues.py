"""The queues of Django's tasks framework that `timeouts.backends.TimeoutsBackend` serves, as
handlers: one biz_type per (backend alias, queue name), registered in every process that loads
Django (apps.py), so the dispatcher routes each task to its Celery queue and the worker finds what
runs it. Nothing here imports Django's tasks framework: a project without it loses nothing.

A task is stored under the biz_type `tasks:<alias>:<queue>` (of the kind KIND, whose biz_types no
project's handler may take); Django's queue "default" runs on Celery's default queue, any other
queue name on the Celery queue of that name.
"""

import hashlib
import re
from dataclasses import dataclass

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from timeouts.conf import get_settings
from timeouts.registry import BIZ_TYPE_RE, Handler, Kind, register_internal, register_kind

PREFIX = "tasks:"
# Registered with the module, so every process that loads Django knows it (apps.py), whether its
# TASKS use this backend or not: the tasks of one that did stay in the table. Claimed as handlers'
# tasks are: the handler of each queue's biz_type runs them (register()).
KIND = register_kind(Kind(
    PREFIX, "Django task", "the tasks of Django's tasks framework that timeouts.backends.TimeoutsBackend stores"))
BACKEND = "timeouts.backends.TimeoutsBackend"
# Django's DEFAULT_TASK_QUEUE_NAME: the queue a task has unless it names one.
DEFAULT_QUEUE = "default"
# Django's semantics: a task that raises is not retried unless the backend is told to.
DEFAULT_MAX_ATTEMPTS = 1
OPTIONS = frozenset({"MAX_ATTEMPTS", "TTR"})


@dataclass(frozen=True)
class BackendOptions:
    alias: str
    queues: tuple
    max_attempts: int
    ttr: int  # seconds an attempt may run: Celery's hard time limit, and the lease


def options(alias: str, params: dict) -> BackendOptions:
    """The backend's TASKS entry, checked: ImproperlyConfigured says what is wrong."""
    queues = params.get("QUEUES", [DEFAULT_QUEUE])
    if isinstance(queues, str) or not queues or not all(isinstance(q, str) and q for q in queues):
        raise ImproperlyConfigured(
            f"TASKS[{alias!r}]: QUEUES must list one or more queue names (each runs on the Celery queue of "
            f"that name, {DEFAULT_QUEUE!r} on Celery's default queue), got {queues!r}")
    given = params.get("OPTIONS") or {}
    unknown = sorted(set(given) - OPTIONS)
    if unknown:
        raise ImproperlyConfigured(f"TASKS[{alias!r}]: unknown OPTIONS {', '.join(unknown)}; "
                                   f"known: {', '.join(sorted(OPTIONS))}")
    values = {"MAX_ATTEMPTS": given.get("MAX_ATTEMPTS", DEFAULT_MAX_ATTEMPTS),
              "TTR": given.get("TTR", get_settings().DEFAULT_TTR)}
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ImproperlyConfigured(f"TASKS[{alias!r}]: OPTIONS[{name!r}] must be a positive integer, got {value!r}")
    return BackendOptions(alias, tuple(dict.fromkeys(queues)), values["MAX_ATTEMPTS"], values["TTR"])


def biz_type_for(alias: str, queue: str) -> str:
    """`tasks:<alias>:<queue>`; names that do not fit a biz_type (64 characters of
    [A-Za-z0-9_.:-]) are cut and cleaned, and end with 8 hex digits of their hash."""
    biz_type = f"{PREFIX}{alias}:{queue}"
    if BIZ_TYPE_RE.fullmatch(biz_type):
        return biz_type
    digest = hashlib.sha256(f"{alias}\x00{queue}".encode("utf-8", "surrogatepass")).hexdigest()[:8]
    cleaned = re.sub(r"[^A-Za-z0-9_.:-]", "_", f"{alias}:{queue}")[:64 - len(PREFIX) - len(digest) - 1]
    return f"{PREFIX}{cleaned}-{digest}"


def celery_queue(queue: str) -> str | None:
    """The Celery queue a task of this queue name is published to; None: Celery's default."""
    return None if queue == DEFAULT_QUEUE else queue


def register(backend: BackendOptions):
    """Register a handler for each of the backend's queues (again: the same handler)."""
    for queue in backend.queues:
        register_internal(Handler(biz_type_for(backend.alias, queue), _Run(backend.alias),
                                  celery_queue(queue), backend.max_attempts, backend.ttr))


def register_from_settings():
    """The handlers of every TASKS entry whose BACKEND is timeouts'."""
    for alias, params in (getattr(settings, "TASKS", None) or {}).items():
        if isinstance(params, dict) and params.get("BACKEND") == BACKEND:
            register(options(alias, params))


@dataclass(frozen=True)
class _Run:
    """The handler's function: runs the task in the worker (timeouts/backends/execution.py),
    imported only there."""

    alias: str

    def __call__(self, task):
        from timeouts.backends.execution import run

        return run(self.alias, task)
