"""Is the deployment doing its job? The checks of `manage.py timeouts_health`, importable for a probe
of your own (`check()`).

Each shard of TIMEOUTS["SHARDS"] is read at once, on a connection that gives up after `timeout`
seconds (bounded_reads.py), and checked on its own:

- **read**: the shard answers, and timeouts' tables can be read. One that cannot be read is
  reported; the others are checked all the same.
- **lateness**: the PENDING task due longest has waited no more than `max_lateness` seconds. That
  task is timeouts_stats' oldest overdue task (by run_at, so a retry waits from its new time),
  leaving out the biz_types paused on purpose (timeouts.pause()), whose tasks wait until resumed.
- **claims**: once a task has waited more than `max_claim_gap` seconds, a dispatcher or a scan
  must have claimed within that time, as the claimers note it (store/last_claims.py). A claim that
  found nothing it could take counts: this check asks whether anything claims at all, lateness
  whether the claimers and the workers keep up.
- **partitions**: the current bucket of PARTITION_INTERVAL and the `partitions_ahead` buckets after
  it lie in partitions (maintenance, timeouts.maintain, keeps PARTITIONS_AHEAD of them created).

A liveness probe runs the claims check alone (a restart of the dispatchers can mend it; a shard
that cannot be read is then no failure: a restart would not mend that), a readiness probe the read
check alone. Each problem is one line of text (`Health.lines()`); `Health.as_dict()` is the JSON.
"""

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from django.db import connections

from timeouts import stats
from timeouts.conf import get_settings
from timeouts.stats import bounded_reads
from timeouts.storage import partitions, shards
from timeouts.store.clock import database_now
from timeouts.store.queries import fetch_dicts, fetch_one

CHECKS = ("read", "lateness", "claims", "partitions")
LIVENESS = ("claims",)
READINESS = ("read",)

DEFAULT_TIMEOUT = 5.0  # seconds a shard may take to answer every read of the check
DUE_COUNT_LIMIT = 10_000  # a late shard's due tasks are counted up to this, then estimated
NAMES_SHOWN = 3  # missing partitions named in a problem's line; the others are counted


@dataclass(frozen=True)
class Thresholds:
    max_lateness: float  # seconds the oldest due task may wait
    max_claim_gap: float  # seconds without a claim while a task has waited that long
    partitions_ahead: int  # buckets after the current one that must have partitions
    timeout: float = DEFAULT_TIMEOUT  # seconds each shard may take to answer

    @classmethod
    def defaults(cls, **given) -> "Thresholds":
        """From TIMEOUTS: a scan claims every SCAN_INTERVAL, so a task waits a minute, and nothing
        claims for half a minute, only when something is wrong (never less than three scans'
        worth); maintenance keeps PARTITIONS_AHEAD buckets ahead, one fewer for a minute after each
        bucket starts."""
        settings = get_settings()
        values = {"max_lateness": max(60.0, 3 * settings.SCAN_INTERVAL),
                  "max_claim_gap": max(30.0, 3 * settings.SCAN_INTERVAL),
                  "partitions_ahead": settings.PARTITIONS_AHEAD - 1}
        values.update({name: value for name, value in given.items() if value is not None})
        return cls(**values)

    def __post_init__(self):
        for name in ("max_lateness", "max_claim_gap", "timeout"):
            value = getattr(self, name)
            if not _number(value, float) or not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a number of seconds above 0, got {value!r}")
        if not _number(self.partitions_ahead, int) or self.partitions_ahead < 0:
            raise ValueError(f"partitions_ahead must be an integer >= 0, got {self.partitions_ahead!r}")


def _number(value, kind) -> bool:
    """An int (or, for a float, an int or a float), never a bool."""
    return not isinstance(value, bool) and isinstance(value, (int, float) if kind is float else int)


@dataclass(frozen=True)
class Problem:
    check: str  # one of CHECKS
    shard: str
    message: str


@dataclass
class ShardHealth:
    """What was read on one shard, and what is wrong there."""

    alias: str
    error: str | None = None  # why it could not be read; None: it was
    now: datetime | None = None  # its database clock
    oldest_due: dict | None = None  # the oldest due task of a biz_type not paused, with its `age`
    paused: list[str] = field(default_factory=list)
    due: stats.Count | None = None  # its due tasks, counted only when they wait too long
    last_claims: list[dict] = field(default_factory=list)  # newest first: claimer, claimed_at, process, age
    partitions_through: datetime | None = None  # partitions cover the time from the current bucket to this
    missing_partitions: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    def as_dict(self) -> dict:
        oldest = self.oldest_due
        return {
            "read": self.error is None, "error": self.error, "now": _iso(self.now),
            "oldest_due": oldest and {**{k: v for k, v in oldest.items() if k != "age"},
                                      "action_time": _iso(oldest["action_time"]), "run_at": _iso(oldest["run_at"]),
                                      "age_seconds": oldest["age"].total_seconds()},
            "paused": self.paused,
            "due": self.due and {"count": self.due.value, "exact": self.due.exact},
            "last_claims": [{"claimer": c["claimer"], "claimed_at": _iso(c["claimed_at"]), "process": c["process"],
                             "age_seconds": c["age"].total_seconds()} for c in self.last_claims],
            "partitions_through": _iso(self.partitions_through),
            "missing_partitions": self.missing_partitions,
        }


@dataclass
class Health:
    checks: tuple[str, ...]
    thresholds: Thresholds
    shards: dict[str, ShardHealth]

    @property
    def problems(self) -> list[Problem]:
        return [problem for shard in self.shards.values() for problem in shard.problems]

    @property
    def ok(self) -> bool:
        return not self.problems

    def lines(self) -> list[str]:
        """One line per problem; with several shards, each starts with its shard's alias."""
        several = len(self.shards) > 1
        return [f"{problem.shard}: {problem.message}" if several else problem.message for problem in self.problems]

    def summary(self) -> str:
        """The one line of a healthy deployment: what was checked, and how much room is left."""
        read = [shard for shard in self.shards.values() if shard.error is None]
        parts = [f"{len(read)} of {len(self.shards)} shards read" if len(read) < len(self.shards)
                 else f"{len(read)} shard{'s' if len(read) > 1 else ''} read"]
        parts += [f"{shard.alias} unread, not a failure of this probe ({shard.error})"
                  for shard in self.shards.values() if shard.error is not None]
        if read and "lateness" in self.checks:
            waiting = [shard.oldest_due["age"] for shard in read if shard.oldest_due]
            parts.append(f"oldest due task waited {stats.seconds(max(waiting))} (limit "
                         f"{stats.seconds(self.thresholds.max_lateness)})" if waiting else "no task due")
        if read and "claims" in self.checks:
            parts.append(_claims_summary(read))
        if read and "partitions" in self.checks:
            through = min(shard.partitions_through for shard in read)
            parts.append(f"partitions through {through:%Y-%m-%d %H:%M} UTC")
        return "OK: " + "; ".join(parts)

    def as_dict(self) -> dict:
        return {
            "ok": self.ok,
            "checks": list(self.checks),
            "thresholds": vars(self.thresholds),
            "problems": [vars(problem) for problem in self.problems],
            "shards": {alias: shard.as_dict() for alias, shard in self.shards.items()},
        }


def check(*, aliases=None, checks=CHECKS, thresholds: Thresholds | None = None) -> Health:
    """Read every shard (or `aliases`) and run `checks` on each (CHECKS, LIVENESS or READINESS)."""
    unknown = set(checks) - set(CHECKS)
    if unknown or not checks:
        raise ValueError(f"checks must be some of {', '.join(CHECKS)}, got {list(checks)!r}")
    thresholds = thresholds or Thresholds.defaults()
    aliases = tuple(aliases or shards.aliases())
    read = bounded_reads.read_each(aliases, lambda alias: _read(alias, thresholds), timeout=thresholds.timeout)
    found = {}
    for alias, outcome in read.items():
        if isinstance(outcome, bounded_reads.Unreadable):
            shard = ShardHealth(alias, error=outcome.error)
            if "read" in checks:
                shard.problems.append(Problem("read", alias, f"cannot read the database {alias!r}: {outcome.error}"))
        else:
            shard = outcome
            shard.problems = [problem for problem in _judge(shard, thresholds) if problem.check in checks]
        found[alias] = shard
    return Health(tuple(checks), thresholds, found)


# --- On one shard, in its own thread (bounded_reads) -----------------------------------------------

def _read(alias, thresholds) -> ShardHealth:
    db = connections[alias]
    shard = ShardHealth(alias, now=database_now(alias))
    oldest = stats.oldest_overdue(alias)
    shard.paused = sorted(name for name, row in stats.stored_limits(using=alias).items() if row["paused"])
    if oldest is not None and oldest["biz_type"] in shard.paused:
        oldest = fetch_one("oldest_due_unpaused", using=db)
    shard.oldest_due = oldest
    if oldest is not None and oldest["age"].total_seconds() > thresholds.max_lateness:
        shard.due = stats.overdue(limit=DUE_COUNT_LIMIT, using=alias)
    shard.last_claims = fetch_dicts("last_claims", using=db)
    _read_partitions(shard, partitions.list_partitions(db), thresholds.partitions_ahead)
    return shard


def _read_partitions(shard, found, ahead):
    """The buckets from the current one to `ahead` after it that no partition (or run of
    partitions, after a change of PARTITION_INTERVAL) covers whole, and how far partitions reach."""
    interval = get_settings().PARTITION_INTERVAL
    ranges = [(p.lower, p.upper) for p in found if not p.is_default]
    start = partitions.bucket_start(shard.now, interval)
    shard.partitions_through = _covered_until(start, ranges)
    for _ in range(ahead + 1):
        end = partitions.next_bucket(start, interval)
        if _covered_until(start, ranges) < end:
            shard.missing_partitions.append(partitions.partition_name(start, interval))
        start = end


def _covered_until(moment, ranges) -> datetime:
    """How far from `moment` the ranges cover time without a gap (`moment` itself if they do not
    cover it). A bound of None is MINVALUE or MAXVALUE."""
    reached = True
    while reached:
        reached = False
        for lower, upper in ranges:
            if (lower is None or lower <= moment) and (upper is None or moment < upper):
                if upper is None:
                    return datetime.max.replace(tzinfo=UTC)
                moment, reached = upper, True
    return moment


# --- Judging what was read -------------------------------------------------------------------------

def _judge(shard, thresholds):
    oldest = shard.oldest_due
    waited = oldest["age"] if oldest else timedelta(0)
    if waited.total_seconds() > thresholds.max_lateness:
        yield Problem("lateness", shard.alias, (
            f"tasks wait too long: the oldest due task, job {oldest['job_id']} ({oldest['biz_type']}:"
            f"{oldest['biz_id']}), has waited {stats.seconds(waited)}, more than "
            f"{stats.seconds(thresholds.max_lateness)}; {shard.due} task{'' if shard.due.value == 1 else 's'} due"))
    if waited.total_seconds() > thresholds.max_claim_gap:
        last = shard.last_claims[0] if shard.last_claims else None
        if last is None:
            yield Problem("claims", shard.alias, (
                f"nothing claims: no dispatcher or scan has ever claimed here, and a due task has waited "
                f"{stats.seconds(waited)}"))
        elif last["age"].total_seconds() > thresholds.max_claim_gap:
            yield Problem("claims", shard.alias, (
                f"nothing claims: no dispatcher or scan has claimed for {stats.seconds(last['age'])} (the last, "
                f"a {last['claimer']} on {last['process']}), more than {stats.seconds(thresholds.max_claim_gap)}, "
                f"and a due task has waited {stats.seconds(waited)}"))
    missing = shard.missing_partitions
    if missing:
        names = ", ".join(missing[:NAMES_SHOWN]) + (f" and {len(missing) - NAMES_SHOWN} more"
                                                     if len(missing) > NAMES_SHOWN else "")
        yield Problem("partitions", shard.alias, (
            f"partitions missing: {names}, of the current bucket and the {thresholds.partitions_ahead} after it; "
            f"tasks due then go to the DEFAULT partition"))


def _claims_summary(read) -> str:
    """The freshest claim of each shard read; with several shards, the stalest of those."""
    never = [shard.alias for shard in read if not shard.last_claims]
    if len(never) == len(read):
        return "no claim noted yet"
    last = max((shard.last_claims[0] for shard in read if shard.last_claims), key=lambda claim: claim["age"])
    text = (f"last claim {stats.seconds(last['age'])} ago ({last['claimer']})" if len(read) == 1
            else f"last claim on each shard at most {stats.seconds(last['age'])} ago")
    return text + (f", none noted yet on {', '.join(never)}" if never else "")


def _iso(moment):
    return moment.isoformat() if moment is not None else None
