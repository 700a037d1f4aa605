"""The `TIMEOUTS` setting: defaults, validation, and one cached, typed object to read it from."""

from dataclasses import dataclass, fields
from datetime import timedelta
from functools import cache

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver

INTERVALS = ("hour", "day", "week", "month")


@dataclass(frozen=True)
class Settings:
    PARTITION_INTERVAL: str = "day"
    PARTITIONS_AHEAD: int = 14
    RETENTION: timedelta = timedelta(days=7)
    SCAN_INTERVAL: float = 5.0
    SCAN_BATCH_SIZE: int = 500
    DEFAULT_MAX_ATTEMPTS: int = 16
    DEFAULT_TTR: int = 60
    NOTIFY_CHANNEL: str = "timeouts"
    NOTIFY_HORIZON: float = 60.0
    DISPATCH_LEAD: float = 0.1
    MAX_ATTRIBUTE_BYTES: int = 65536
    # Run the low-latency dispatcher as a thread inside each Celery worker process, so a small
    # deployment needs no extra process.
    DISPATCHER_IN_WORKER: bool = False
    # Backpressure: at most this many tasks claimed but not yet started. Claiming more than the
    # workers start within half a TTR would only expire their leases and publish them again, so keep
    # it <= (tasks your workers start per second) x TTR / 2. 1,000 suits >= 33 starts/s at TTR 60.
    MAX_DISPATCHED: int = 1_000
    # Tasks due together travel to a worker in one message of up to this many (`timeouts.run_batch`),
    # run one after another, each with its own compare-and-set: Celery's cost per message, which is
    # most of the cost of a quick handler, is paid once per batch. 1 sends every task on its own.
    RUN_BATCH_SIZE: int = 20
    # The Django database aliases that hold timeouts' tables (shards.py): a task lives on the one
    # its biz_id hashes to, or on the one SHARD_ROUTER (a dotted path to f(biz_type, biz_id) ->
    # alias) picks.
    SHARDS: tuple = ("default",)
    SHARD_ROUTER: str | None = None

    def __post_init__(self):
        problems = list(_problems(self))
        if problems:
            raise ImproperlyConfigured("TIMEOUTS setting: " + "; ".join(problems))


def _problems(s):
    def number(name, low, *, integer=False):
        value = getattr(s, name)
        kinds = (int,) if integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds):
            yield f"{name} must be {'an integer' if integer else 'a number'}, got {value!r}"
        elif not value >= low:  # also catches NaN
            yield f"{name} must be >= {low}, got {value!r}"

    if s.PARTITION_INTERVAL not in INTERVALS:
        yield f"PARTITION_INTERVAL must be one of {', '.join(INTERVALS)}, got {s.PARTITION_INTERVAL!r}"
    yield from number("PARTITIONS_AHEAD", 1, integer=True)
    if not isinstance(s.RETENTION, timedelta) or s.RETENTION < timedelta(0):
        yield f"RETENTION must be a non-negative timedelta, got {s.RETENTION!r}"
    yield from number("SCAN_INTERVAL", 0.1)
    yield from number("SCAN_BATCH_SIZE", 1, integer=True)
    yield from number("DEFAULT_MAX_ATTEMPTS", 1, integer=True)
    yield from number("DEFAULT_TTR", 1, integer=True)
    yield from number("NOTIFY_HORIZON", 0)
    yield from number("DISPATCH_LEAD", 0)
    yield from number("MAX_ATTRIBUTE_BYTES", 2, integer=True)
    yield from number("MAX_DISPATCHED", 1, integer=True)
    yield from number("RUN_BATCH_SIZE", 1, integer=True)
    if not isinstance(s.DISPATCHER_IN_WORKER, bool):
        yield f"DISPATCHER_IN_WORKER must be True or False, got {s.DISPATCHER_IN_WORKER!r}"
    yield from _shard_problems(s)
    channel = s.NOTIFY_CHANNEL
    if not isinstance(channel, str) or not channel or len(channel.encode()) > 63:
        # PostgreSQL silently truncates longer identifiers: two apps could then share a channel.
        yield f"NOTIFY_CHANNEL must be a non-empty string of at most 63 bytes, got {channel!r}"


def _shard_problems(s):
    shards = s.SHARDS
    if isinstance(shards, str) or not isinstance(shards, (list, tuple)) or not shards:
        yield f"SHARDS must be a non-empty list of database aliases, got {shards!r}"
        return
    for alias in shards:
        if alias not in django_settings.DATABASES:
            yield f"SHARDS: {alias!r} is not a database alias (DATABASES has {', '.join(django_settings.DATABASES)})"
    if len(set(shards)) != len(shards):
        yield f"SHARDS must name each alias once, got {list(shards)!r}"
    if s.SHARD_ROUTER is not None and (not isinstance(s.SHARD_ROUTER, str) or "." not in s.SHARD_ROUTER):
        yield f"SHARD_ROUTER must be the dotted path of a function, got {s.SHARD_ROUTER!r}"


def notify_params() -> dict:
    """The parameters every query that may wake the dispatchers takes."""
    settings = get_settings()
    return {"channel": settings.NOTIFY_CHANNEL, "horizon": float(settings.NOTIFY_HORIZON)}


KEYS = frozenset(f.name for f in fields(Settings))


@cache
def get_settings() -> Settings:
    given = getattr(django_settings, "TIMEOUTS", {}) or {}
    unknown = sorted(set(given) - KEYS)
    if unknown:
        raise ImproperlyConfigured(f"TIMEOUTS setting: unknown key(s) {', '.join(unknown)}")
    if isinstance(given.get("SHARDS"), list):
        given = {**given, "SHARDS": tuple(given["SHARDS"])}  # one type, whichever the host wrote
    return Settings(**given)


@receiver(setting_changed)
def _forget_settings(*, setting, **kwargs):
    if setting == "TIMEOUTS":
        get_settings.cache_clear()
