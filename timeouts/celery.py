"""Celery wiring for host projects: one call, `timeouts.celery.setup(app)`, in the project's celery.py.

    app = Celery("proj")
    app.config_from_object("django.conf:settings", namespace="CELERY")
    timeouts.celery.setup(app)
    app.autodiscover_tasks()

`setup()` changes only what timeouts relies on, and a setting only where the host left Celery's
default: a value the host chose is kept, and the system check `timeouts.W005` says what it costs.
"""

from typing import TYPE_CHECKING, Any
from weakref import WeakKeyDictionary as _WeakKeyDictionary

from kombu import Exchange as _Exchange
from kombu import Queue as _Queue

from timeouts.conf import get_settings
from timeouts.dispatch.brokers import is_amqp
from timeouts.durable import unpacking as _unpacking  # noqa: F401 - registers the task of calls sent together
from timeouts.durable.calls import cancel
from timeouts.durable.task import DurableTask
from timeouts.worker import reconnect_prefetch

if TYPE_CHECKING:
    from celery import Celery

__all__ = ["DurableTask", "beat_schedule", "cancel", "setup"]

MAINTAIN_INTERVAL = 60.0  # seconds; partitions are created days ahead, leases are also recovered by scans
BEAT_TASKS = ("timeouts.scan", "timeouts.maintain")
BEAT_QUEUE = "timeouts"
# Celery's default. A worker process reserves this many messages per process; a timeouts message is
# due when it arrives, so one held back in a busy process waits while another process may be idle.
CELERY_DEFAULT_PREFETCH = 4

# The apps setup() has wired (for the system check), with the queue of their beat tasks.
_set_up: "_WeakKeyDictionary[Celery, str | None]" = _WeakKeyDictionary()


def beat_schedule() -> dict[str, dict[str, Any]]:
    """The beat entries of timeouts' two periodic tasks. `setup()` merges them; call this only to keep
    beat entries elsewhere (a database scheduler, say)."""
    settings = get_settings()
    return {
        "timeouts.scan": {
            "task": "timeouts.scan",
            "schedule": settings.SCAN_INTERVAL,
            # A scan that waited a whole interval in the queue is superseded by the next one.
            "options": {"expires": settings.SCAN_INTERVAL},
        },
        "timeouts.maintain": {
            "task": "timeouts.maintain",
            "schedule": MAINTAIN_INTERVAL,
            "options": {"expires": MAINTAIN_INTERVAL},
        },
    }


def setup(app: "Celery", *, beat_queue: str | None = BEAT_QUEUE) -> None:
    """Wire `app` for timeouts, once its configuration is read:

    - merge `beat_schedule()` into `beat_schedule` (the host's own entries of the same name win);
    - route `timeouts.scan` and `timeouts.maintain` to `beat_queue` (declared in `task_queues`, so a
      worker started without `-Q` consumes it), so that the safety scan never waits behind a backlog
      of the host's own tasks; `None` keeps them on the default queue;
    - accept JSON (timeouts' messages are JSON whatever `task_serializer` says);
    - `worker_prefetch_multiplier = 1` if the host left Celery's default of 4;
    - publisher confirms on RabbitMQ (`confirm_publish`) unless the host set them;
    - `worker_enable_prefetch_count_reduction = False` if the host left Celery's default
      (reconnect_prefetch.py).

    `timeouts.run` and `timeouts.run_batch` carry their own `acks_late` and `reject_on_worker_lost`.
    """
    if app.configured:
        _apply(app, beat_queue)
    else:
        # weak=False: the receiver is a closure that nothing else holds.
        app.on_after_configure.connect(lambda sender, **kwargs: _apply(sender, beat_queue), weak=False)


def _apply(app, beat_queue):
    conf = app.conf
    if beat_queue is not None:
        conf.task_routes = _with_beat_route(conf.task_routes, beat_queue)
        conf.task_queues = _with_queue(conf, beat_queue)
    conf.beat_schedule = {**beat_schedule(), **(conf.beat_schedule or {})}
    if "json" not in conf.accept_content:
        conf.accept_content = [*conf.accept_content, "json"]
    if conf.worker_prefetch_multiplier == CELERY_DEFAULT_PREFETCH:
        conf.worker_prefetch_multiplier = 1
    if is_amqp(conf.broker_url):
        options = dict(conf.broker_transport_options or {})
        options.setdefault("confirm_publish", True)
        conf.broker_transport_options = options
    reconnect_prefetch.apply(conf)
    _set_up[app] = beat_queue


def _with_beat_route(routes, queue):
    """The host's routes first (the first router that answers wins), then ours for the beat tasks."""
    ours = {name: {"queue": queue} for name in BEAT_TASKS}
    if routes is None:
        return (ours,)
    if isinstance(routes, (list, tuple)):
        return (*routes, ours)
    return (routes, ours)


def _with_queue(conf, name):
    """task_queues with `name` added. Left unset, Celery declares its default queue alone: declare
    that one as Celery would, so workers go on consuming it."""
    queues = conf.task_queues
    if queues is None:
        queues = [_Queue(conf.task_default_queue, _Exchange(conf.task_default_exchange or conf.task_default_queue,
                                                          type=conf.task_default_exchange_type),
                        routing_key=conf.task_default_routing_key or conf.task_default_queue)]
    queues = list(queues.values() if isinstance(queues, dict) else queues)
    if any(getattr(queue, "name", queue) == name for queue in queues):
        return queues
    return [*queues, _Queue(name, _Exchange(name), routing_key=name)]


def is_set_up(app: "Celery") -> bool:
    return app in _set_up
