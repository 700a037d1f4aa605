"""Prometheus metrics, when prometheus_client is installed (pip install "django-timeouts[prometheus]").

Counters, per biz_type, counted where the event happens and once it committed (record() listens to
timeouts.events: connect(), which TimeoutsConfig.ready() calls):

    timeouts_scheduled_total, timeouts_dispatched_total, timeouts_done_total,
    timeouts_retried_total, timeouts_dead_total, timeouts_cancelled_total

the histogram `timeouts_lateness_seconds` (started_at - action_time of first attempts), and
`timeouts_late_total`, labelled biz_type and on_late ("run", "skip", "dead"): attempts that started
later than their biz_type's lateness policy allows (timeouts.limiting.lateness), by what became of
them.
Gauges, read from the database when scraped (bounded, indexed queries; above 100,000 rows the two
counts are the planner's estimates):

    timeouts_pending_tasks, timeouts_overdue_tasks, timeouts_oldest_overdue_age_seconds,
    timeouts_default_partition_rows

and per biz_type (every one the deployment knows: its handlers, the biz_types with tasks waiting
or with limits stored): timeouts_biz_type_overdue_tasks (exact up to 10,000, then estimated),
timeouts_biz_type_running_tasks, timeouts_paused (1 while paused), timeouts_rate_limit (handler
starts per second) and timeouts_concurrency_limit (tasks running at once), the last two only where
a limit is in force.

With several shards (TIMEOUTS["SHARDS"]) those gauges keep their names and labels and are totals
over the shards that answered, and per-shard families are added: timeouts_shard_up{shard} (1: it
answered, 0: it did not) and timeouts_shard_pending_tasks, timeouts_shard_overdue_tasks,
timeouts_shard_oldest_overdue_age_seconds, timeouts_shard_default_partition_rows, labelled `shard`.
A new family rather than a `shard` label on the old ones: a label would change the series that
dashboards and alerts of a one-database deployment already follow.

Events happen in many processes: web processes schedule and cancel, Celery worker processes (the
prefork pool's children) claim, run and finish, dispatchers claim. Counting in each process's
memory would leave the scraped process with only its own share, and a prefork child's counts die
with it. So counters use prometheus_client's multiprocess mode: set the environment variable
PROMETHEUS_MULTIPROC_DIR to a directory that every process on the host shares (empty it when the
host's services start), and the view adds up every process's files, including those of processes
that have exited. Without the variable, the view shows the counters of the process serving it
(right for a single process, e.g. runserver or tests).

Counting from the table would not do: rows leave with their partition (a counter computed
from them would go down), and keeping counts in a table would add a write, on one hot row, to
every status change.
"""

import logging
import os
from dataclasses import dataclass, replace

from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse

from timeouts import events, stats
from timeouts.storage import shards
from timeouts.store import clock

__all__ = ["metrics_view"]

logger = logging.getLogger(__name__)

try:
    import prometheus_client
    from prometheus_client import CollectorRegistry, Counter, Histogram, multiprocess
    from prometheus_client.core import GaugeMetricFamily
except ImportError:  # the optional extra is not installed
    prometheus_client = None

# The distribution's name and its extra (pyproject.toml), as a user types them.
INSTALL_PROMETHEUS = 'pip install "django-timeouts[prometheus]"'
MISSING_PROMETHEUS = (f"timeouts.metrics needs prometheus_client, which is not installed. Install it with: "
                      f"{INSTALL_PROMETHEUS}")

PREFIX = "timeouts_"
COUNTED = ("scheduled", "dispatched", "done", "retried", "dead", "cancelled")
LATENESS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0,
                    3600.0, float("inf"))
HELP = {
    "scheduled": "Tasks scheduled (committed).",
    "dispatched": "Tasks claimed and handed to Celery (a task is dispatched again after a retry or an expired lease).",
    "done": "Tasks whose handler returned.",
    "retried": "Handler attempts that raised and will be tried again.",
    "dead": "Tasks that used up their attempts (dead letter).",
    "cancelled": "Tasks cancelled before their handler started (or discarded while dead).",
}

# Our own registry in single-process mode: a host's default registry is left alone. In multiprocess
# mode the values go to PROMETHEUS_MULTIPROC_DIR whatever the registry.
REGISTRY = CollectorRegistry(auto_describe=True) if prometheus_client else None
COUNTING = prometheus_client is not None  # connect() has record() listen only then
COUNTERS = {}
LATENESS = None
LATE = None

if prometheus_client:
    COUNTERS = {event: Counter(f"{PREFIX}{event}", HELP[event], ["biz_type"], registry=REGISTRY)
                for event in COUNTED}
    LATENESS = Histogram(f"{PREFIX}lateness_seconds", "started_at - action_time of first attempts.",
                         ["biz_type"], buckets=LATENESS_BUCKETS, registry=REGISTRY)
    LATE = Counter(f"{PREFIX}late", "Attempts that started later than their biz_type's max_lateness, by the "
                   "policy that applied (on_late: run, skip or dead).", ["biz_type", "on_late"], registry=REGISTRY)


def require_prometheus_client() -> None:
    """Raise ImproperlyConfigured, saying which extra to install, when prometheus_client is missing:
    what needs it fails there rather than with a NameError deep inside."""
    if prometheus_client is None:
        raise ImproperlyConfigured(MISSING_PROMETHEUS)


def connect() -> None:
    """Count timeouts.events' events, if prometheus_client is installed: record() listens to them."""
    if COUNTING:
        events.listen(record)


def record(event, biz_type, count=1, lateness=None, on_late=None):
    """Count one event of timeouts.events (the label given by position: labels(biz_type=) checks and
    sorts the keyword names on every call)."""
    if not COUNTING:  # connect() listens only with prometheus_client; a direct call needs it too
        require_prometheus_client()
    if event in COUNTERS:
        COUNTERS[event].labels(biz_type).inc(count)
    elif event == "started" and lateness is not None:
        LATENESS.labels(biz_type).observe(max(lateness, 0.0))
    elif event == "late":
        LATE.labels(biz_type, on_late).inc(count)


@dataclass(frozen=True)
class _ShardGauges:
    """What the gauges read from one database."""

    pending: int
    overdue: int
    oldest_overdue_age: float  # seconds; 0: none
    default_rows: int
    biz_types: list


GAUGES = {
    "pending_tasks": ("PENDING tasks (exact up to 100,000, then estimated).", lambda g: g.pending),
    "overdue_tasks": ("PENDING tasks already due (exact up to 100,000, then estimated).", lambda g: g.overdue),
    "oldest_overdue_age_seconds": ("How long the longest-waiting due task has been due (0: none).",
                                   lambda g: g.oldest_overdue_age),
    "default_partition_rows": ("Rows in the DEFAULT partition (outside every range partition).",
                               lambda g: g.default_rows),
}


def _read(alias) -> _ShardGauges:
    oldest = stats.oldest_overdue(using=alias)
    return _ShardGauges(
        pending=stats.pending(using=alias).value, overdue=stats.overdue(using=alias).value,
        oldest_overdue_age=max(oldest["age"].total_seconds(), 0.0) if oldest else 0.0,
        default_rows=stats.default_rows(using=alias).value,
        biz_types=stats.biz_types(clock.database_now(alias), using=alias))


def _total(read) -> _ShardGauges:
    """The shards' gauges together: counts summed, the oldest overdue the oldest of all, each
    biz_type's tasks summed and its limits those of the first shard that lists it (limits are
    written to every shard)."""
    biz_types = {}
    for gauges in read:
        for biz_type in gauges.biz_types:
            seen = biz_types.get(biz_type.name)
            biz_types[biz_type.name] = biz_type if seen is None else replace(
                seen, overdue=seen.overdue + biz_type.overdue, running=seen.running + biz_type.running)
    return _ShardGauges(
        pending=sum(g.pending for g in read), overdue=sum(g.overdue for g in read),
        oldest_overdue_age=max(g.oldest_overdue_age for g in read),
        default_rows=sum(g.default_rows for g in read), biz_types=[biz_types[name] for name in sorted(biz_types)])


class DatabaseCollector:
    """Gauges computed from the database at scrape time: from `using`, else from every shard.

    With several shards the gauges are totals over the shards that answered (same names and labels
    as with one database, so dashboards need no change), and timeouts_shard_* families, labelled
    `shard`, give each shard's own and whether it answered (timeouts_shard_up). With one, a database
    that does not answer fails the scrape, as before."""

    def __init__(self, using=None):
        require_prometheus_client()  # collect() builds prometheus_client's metric families
        self.using = using

    def collect(self):
        aliases = (self.using,) if self.using else shards.aliases()
        if len(aliases) == 1:
            yield from self.gauges(_read(aliases[0]))
            return
        read = {}
        for alias in aliases:
            try:
                read[alias] = _read(alias)
            except DatabaseError:  # that shard shows as down; the others are still counted
                logger.warning("timeouts: the metrics could not read the shard %r", alias, exc_info=True)
        if read:  # with no shard read, no totals rather than zeros that look healthy
            yield from self.gauges(_total(list(read.values())))
        yield from self.per_shard(aliases, read)

    def gauges(self, read):
        for name, (help_text, value_of) in GAUGES.items():
            yield GaugeMetricFamily(f"{PREFIX}{name}", help_text, value=value_of(read))
        yield from self.per_biz_type(read.biz_types)

    def per_shard(self, aliases, read):
        up = GaugeMetricFamily(f"{PREFIX}shard_up", "1 when the shard answered this scrape, else 0.",
                               labels=["shard"])
        for alias in aliases:
            up.add_metric([alias], float(alias in read))
        yield up
        for name, (help_text, value_of) in GAUGES.items():
            family = GaugeMetricFamily(f"{PREFIX}shard_{name}", f"{help_text[:-1]}, on the shard.",
                                       labels=["shard"])
            for alias, gauges in read.items():
                family.add_metric([alias], float(value_of(gauges)))
            yield family

    def per_biz_type(self, found):
        families = {
            "biz_type_overdue_tasks": (
                "PENDING tasks of the biz_type already due (exact up to 10,000, then estimated).",
                lambda b: b.overdue.value),
            "paused": ("1 while the biz_type is paused (timeouts.pause()): none of its tasks is claimed.",
                       lambda b: float(b.limits.paused)),
            "rate_limit": ("Handler starts per second allowed for the biz_type, in force (absent: no limit).",
                           lambda b: b.limits.rate_limit),
            "concurrency_limit": ("Tasks of the biz_type allowed to run at once, in force (absent: no limit).",
                                  lambda b: b.limits.concurrency),
            "biz_type_running_tasks": ("RUNNING tasks of the biz_type (exact up to 10,000 claimed or running).",
                                       lambda b: b.running.value),
        }
        for name, (help_text, value_of) in families.items():
            family = GaugeMetricFamily(f"{PREFIX}{name}", help_text, labels=["biz_type"])
            for biz_type in found:
                value = value_of(biz_type)
                if value is not None:
                    family.add_metric([biz_type.name], float(value))
            yield family


class _OurMultiProcessCollector:
    """Every process's timeouts_* metrics from PROMETHEUS_MULTIPROC_DIR (not the host's others)."""

    def __init__(self, path):
        require_prometheus_client()
        self.inner = multiprocess.MultiProcessCollector(None, path=path)

    def collect(self):
        return [family for family in self.inner.collect() if family.name.startswith(PREFIX)]


def exposition(using=None) -> bytes:
    """The metrics in Prometheus' text format; the gauges from `using`, else from every shard.

    Without prometheus_client, raises ImproperlyConfigured saying which extra to install."""
    require_prometheus_client()
    registry = CollectorRegistry(auto_describe=False)
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if path:
        registry.register(_OurMultiProcessCollector(path))
    else:
        registry.register(REGISTRY)
    registry.register(DatabaseCollector(using))
    return prometheus_client.generate_latest(registry)


def metrics_view(request: HttpRequest) -> HttpResponse:
    """Add to the host's urls, e.g. path("metrics/timeouts", timeouts.metrics.metrics_view); restrict
    who can reach it (network policy, or wrap it in a view that checks a token)."""
    if prometheus_client is None:
        return HttpResponse(f"prometheus_client is not installed: {INSTALL_PROMETHEUS}\n", status=501,
                            content_type="text/plain; charset=utf-8")
    return HttpResponse(exposition(), content_type=prometheus_client.CONTENT_TYPE_LATEST)
