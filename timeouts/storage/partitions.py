"""Partition maintenance: keep the time wheel's buckets created ahead, drop the expired ones.

`maintain()` runs from `migrate` (inside the migration's transaction), from the Celery task
`timeouts.maintain` (autocommit) and from `manage.py timeouts_partitions`. One run:

1. finishes any drop an earlier run left half done (a table it detached but did not drop);
2. creates the partition of the current bucket and of the PARTITIONS_AHEAD buckets after it, plus
   one for every past bucket that holds rows parked in DEFAULT (so they can be dropped with it
   later); rows of a new partition's range are moved out of DEFAULT in the same transaction.
   Far-future rows stay in DEFAULT until the window reaches them. A bucket that would overlap an
   existing partition (PARTITION_INTERVAL was changed) is skipped: its rows stay in DEFAULT;
3. drops partitions whose upper bound is at least RETENTION in the past and that hold no
   unfinished task (PENDING, DISPATCHED, RUNNING or DEAD: dead tasks wait for an operator).
   Retention is DROP TABLE, never a bulk DELETE.

Buckets are UTC-aligned: hour, day, week (from Monday 00:00) or month. Each partition's change is a
transaction (or savepoint) of its own under a short lock_timeout (see partition_ddl), so one
failure undoes nothing else and claims are never queued behind maintenance for long. A step that
could not get its locks is reported as failed; the next run does it.
"""

import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.db import DatabaseError, connections

from timeouts.conf import get_settings
from timeouts.storage import partition_ddl as ddl
from timeouts.store.queries import execute, fetch_dicts, fetch_one

PREFIX = "timeouts_task_"
LETTERS = {"hour": "h", "day": "d", "week": "w", "month": "m"}
NAME_FORMATS = {"hour": "%Y%m%d%H", "day": "%Y%m%d", "week": "%Y%m%d", "month": "%Y%m"}
INTERVAL_OF_LETTER = {letter: interval for interval, letter in LETTERS.items()}
NAME_PATTERN = re.compile(rf"^{PREFIX}([hdwm])(\d+)$")

# Two-key advisory lock: first key "part", distinct from scheduling's namespace.
LOCK_NAMESPACE, LOCK_KEY = 0x70617274, 1


# --- Buckets -------------------------------------------------------------------------------------

def bucket_start(moment: datetime, interval: str) -> datetime:
    """The start of the UTC bucket holding `moment`."""
    moment = moment.astimezone(UTC)
    if interval == "hour":
        return moment.replace(minute=0, second=0, microsecond=0)
    day = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    if interval == "day":
        return day
    if interval == "week":
        return day - timedelta(days=day.weekday())  # Monday
    if interval == "month":
        return day.replace(day=1)
    raise ValueError(f"unknown partition interval {interval!r}")


def next_bucket(start: datetime, interval: str) -> datetime:
    if interval == "month":
        return start.replace(year=start.year + start.month // 12, month=start.month % 12 + 1)
    return start + {"hour": timedelta(hours=1), "day": timedelta(days=1), "week": timedelta(weeks=1)}[interval]


def partition_name(start: datetime, interval: str) -> str:
    """timeouts_task_h2026112113, _d20261121, _w20261116 (the Monday), _m202611."""
    return f"{PREFIX}{LETTERS[interval]}{start.astimezone(UTC).strftime(NAME_FORMATS[interval])}"


def bounds_from_name(name: str):
    """(lower, upper) of a partition named by partition_name(), or None for any other name."""
    match = NAME_PATTERN.match(name)
    if not match:
        return None
    interval = INTERVAL_OF_LETTER[match[1]]
    try:
        start = datetime.strptime(match[2], NAME_FORMATS[interval]).replace(tzinfo=UTC)
    except ValueError:
        return None
    if partition_name(start, interval) != name or bucket_start(start, interval) != start:
        return None  # e.g. a "week" that does not start on a Monday
    return start, next_bucket(start, interval)


# --- The report ----------------------------------------------------------------------------------

@dataclass
class Partition:
    name: str
    lower: datetime | None  # None: DEFAULT, or MINVALUE
    upper: datetime | None  # None: DEFAULT, or MAXVALUE
    estimated_rows: int | None  # from the planner's statistics; None until first analyzed
    is_default: bool = False

    def overlaps(self, lower, upper) -> bool:
        if self.is_default:
            return False
        return (self.lower is None or self.lower < upper) and (self.upper is None or lower < self.upper)

    def as_dict(self):
        return {"name": self.name, "lower": _iso(self.lower), "upper": _iso(self.upper),
                "estimated_rows": self.estimated_rows, "default": self.is_default}


def _iso(moment):
    return moment.isoformat() if moment is not None else None


@dataclass
class Report:
    """What one maintenance run did (or, with dry_run, would do)."""

    interval: str
    dry_run: bool
    now: datetime | None = None
    busy: bool = False  # another maintenance held the lock: nothing was done
    created: list[str] = field(default_factory=list)
    moved_rows: dict[str, int] = field(default_factory=dict)  # partition -> rows moved out of DEFAULT
    dropped: list[str] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)  # past retention but kept: name -> why
    skipped_overlaps: dict[str, str] = field(default_factory=dict)  # bucket name -> what it overlaps
    failed: dict[str, str] = field(default_factory=dict)  # name -> error (the next run tries again)
    why: dict[str, str] = field(default_factory=dict)  # created or dropped name -> why
    default_rows: int = 0
    partitions: list[Partition] = field(default_factory=list)  # as they are at the end of the run

    @property
    def total_moved(self) -> int:
        return sum(self.moved_rows.values())

    def summary(self) -> dict:
        """A JSON-serialisable dict (the Celery task's result)."""
        return {
            "now": _iso(self.now), "interval": self.interval, "dry_run": self.dry_run, "busy": self.busy,
            "created": list(self.created), "moved_rows": dict(self.moved_rows), "total_moved": self.total_moved,
            "dropped": list(self.dropped), "kept": dict(self.kept), "skipped_overlaps": dict(self.skipped_overlaps),
            "failed": dict(self.failed), "why": dict(self.why), "default_rows": self.default_rows,
            "partitions": [p.as_dict() for p in self.partitions],
        }


# --- Maintenance ---------------------------------------------------------------------------------

def maintain(using="default", *, now=None, dry_run=False) -> Report:
    """Create, move and drop partitions as described in the module docstring; return a Report.

    `now` (an aware datetime) defaults to the database clock. With `dry_run`, only reads."""
    settings = get_settings()
    if now is not None and (now.tzinfo is None or now.utcoffset() is None):
        raise ValueError("maintain(now=...) needs an aware datetime")
    connection = connections[using]
    report = Report(interval=settings.PARTITION_INTERVAL, dry_run=dry_run)
    with _maintenance_lock(connection, needed=not dry_run) as locked:
        if not locked:
            report.busy = True
            return report
        report.now = (now or fetch_one("database_now", using=connection)["now"]).astimezone(UTC)
        run = _Run(connection, report, settings)
        run.finish_leftovers()
        run.create_buckets()
        run.drop_expired(cutoff=report.now - settings.RETENTION)
        report.default_rows = fetch_one("default_row_count", using=connection)["rows"]
        report.partitions = list_partitions(connection)
    return report


def list_partitions(connection) -> list[Partition]:
    return [
        Partition(row["name"], row["lower_bound"], row["upper_bound"], row["estimated_rows"], row["is_default"])
        for row in fetch_dicts("list_partitions", using=connection)
    ]


@contextmanager
def _maintenance_lock(connection, *, needed):
    if not needed:
        yield True
        return
    keys = {"namespace": LOCK_NAMESPACE, "key": LOCK_KEY}
    locked = fetch_one("try_maintenance_lock", keys, using=connection)["locked"]
    try:
        yield locked
    finally:
        if locked:
            try:
                execute("release_maintenance_lock", keys, using=connection).close()
            except DatabaseError:
                # Only when an error already aborted the caller's transaction (inside migrate): that
                # error is the one to see, and the lock ends with the session.
                pass


class _Run:
    """The state of one maintain() call."""

    def __init__(self, connection, report, settings):
        self.connection = connection
        self.report = report
        self.settings = settings
        # Set once a step gave up for want of a lock: every later step needs the same locks (DEFAULT
        # or the parent), so they are reported as not attempted instead of each waiting in turn.
        self.lock_busy = False

    def _step(self, name, action, *args):
        """Run one DDL step: (True, its result) if it was done, None if not. Failures are
        reported, never raised: the next run tries again."""
        if self.lock_busy:
            self.report.failed[name] = "not attempted: an earlier step could not get its locks in time"
            return None
        try:
            return True, action(self.connection, name, *args)
        except ddl.StepFailed as exc:
            self.lock_busy = exc.lock_busy
            self.report.failed[name] = str(exc)
            return None

    def wanted_buckets(self):
        """(start, why) of the buckets that should exist, oldest first."""
        interval, now = self.settings.PARTITION_INTERVAL, self.report.now
        current = bucket_start(now, interval)
        wanted = {}
        for row in fetch_dicts("default_past_buckets", {"unit": interval, "before": current}, using=self.connection):
            wanted[row["start"].astimezone(UTC)] = f"past bucket holding {row['rows']} row(s) parked in DEFAULT"
        start = current
        for ahead in range(self.settings.PARTITIONS_AHEAD + 1):
            wanted[start] = "current bucket" if ahead == 0 else f"{ahead} ahead"
            start = next_bucket(start, interval)
        return sorted(wanted.items())

    def create_buckets(self):
        interval = self.settings.PARTITION_INTERVAL
        existing = list_partitions(self.connection)
        for lower, why in self.wanted_buckets():
            upper, name = next_bucket(lower, interval), partition_name(lower, interval)
            same = [p for p in existing if p.lower == lower and p.upper == upper and not p.is_default]
            if same:
                continue  # already there (whatever its name)
            clash = [p for p in existing if p.overlaps(lower, upper) or p.name == name]
            if clash:
                self.report.skipped_overlaps[name] = f"overlaps {clash[0].name}; its rows stay in DEFAULT"
                continue
            if self.report.dry_run:
                moved = fetch_one("default_rows_between", {"lower": lower, "upper": upper}, using=self.connection)
                done = (True, moved["rows"])
            else:
                done = self._step(name, ddl.create_partition, lower, upper)
            if done:
                self.report.created.append(name)
                self.report.moved_rows[name] = done[1]
                self.report.why[name] = why
                existing.append(Partition(name, lower, upper, None))

    def drop_expired(self, cutoff):
        for partition in list_partitions(self.connection):
            if partition.is_default or partition.upper is None or partition.upper > cutoff:
                continue
            if bounds_from_name(partition.name) != (partition.lower, partition.upper):
                self.report.kept[partition.name] = "not a partition this maintenance created: left alone"
                continue
            reason = ddl.unfinished_reason(ddl.status_counts(self.connection, partition.name))
            if reason:
                self.report.kept.setdefault(partition.name, reason)  # keep a re-attach's explanation
            elif self.report.dry_run:
                self._dropped(partition.name, f"all tasks finished, ended {partition.upper.isoformat()}")
            elif self._step(partition.name, ddl.detach):
                self._drop_or_reattach(partition.name, f"all tasks finished, ended {partition.upper.isoformat()}")

    def finish_leftovers(self):
        for row in fetch_dicts("detached_leftovers", {"marker": ddl.DETACHED_MARKER}, using=self.connection):
            if self.report.dry_run:
                self.report.kept[row["name"]] = "detached by an interrupted run: will be dropped or re-attached"
            else:
                self._drop_or_reattach(row["name"], "finishing a drop an interrupted run had started")

    def _drop_or_reattach(self, name, why):
        """The second half of a drop. The table is detached, so nobody can write to it: count what it
        holds, then drop it, or attach it again if unfinished tasks got in before it was detached."""
        reason = ddl.unfinished_reason(ddl.status_counts(self.connection, name))
        if reason is None:
            if self._step(name, ddl.drop_detached):
                self._dropped(name, why)
            return
        bounds = bounds_from_name(name)
        if bounds and self._step(name, ddl.reattach, *bounds):
            self.report.kept[name] = f"{reason} (arrived while it was being dropped: attached again)"
        elif not bounds:
            self.report.failed[name] = f"detached with {reason}, but its bounds cannot be read from its name"

    def _dropped(self, name, why):
        self.report.dropped.append(name)
        self.report.why[name] = why
