"""Limits and pauses per biz_type: how many handler starts per second, how many running at once,
and whether any is claimed at all.

They live in the `timeouts_limits` table (sql/migrations/0001_limits.sql), one row per biz_type
that has any, and the claim (`claim_due` in sql/queries/claims.sql) reads them in the statement that claims: a task held
back by a limit or a pause waits in the table, PENDING, and is claimed once it may start (late,
never lost, never early). So a change is in force at the next claim of every dispatcher and scan,
survives restarts, and holds however many of them run.

A handler's own values (`@timeouts.handler(rate_limit=, concurrency=)`) live in code, which the
database cannot read: `declare()` writes the values of the handlers this process knows into the
table. The scan runs it before it claims and each dispatcher when it starts, so a deploy's values
are in force within SCAN_INTERVAL. Passing them with every claim instead would hand each claim the
values of whichever version of the code its process runs, and the token bucket of a rate limit
needs a row of the table anyway. `set_limits()` overrides them until `reset_limits()`.

The lateness policy (lateness.py: max_lateness, on_late) is kept in the same rows, declared and
overridden the same way, and read by the worker's compare-and-set rather than by the claim.
"""

from dataclasses import dataclass
from datetime import timedelta

from django.db import connections, transaction

from timeouts.conf import notify_params
from timeouts.errors import InvalidOption
from timeouts.registry import check_known, find_handler, registered
from timeouts.storage import shards
from timeouts.store import worker_connection
from timeouts.store.queries import execute, fetch_dicts, fetch_one
from timeouts.validation import check_concurrency, check_lateness_policy, check_rate_limit


@dataclass(frozen=True)
class Limits:
    """What is in force for a biz_type: at most `rate_limit` handler starts per second and
    `concurrency` tasks running at once (None: no limit), whether it is paused, and its lateness
    policy: what becomes of an attempt that starts more than `max_lateness` after it was due
    (`on_late`: "run", "skip" or "dead"; timeouts.limiting.lateness)."""

    rate_limit: float | None = None
    concurrency: int | None = None
    paused: bool = False
    max_lateness: timedelta | None = None
    on_late: str = "run"


class Unchanged:
    """The type of UNCHANGED."""

    def __repr__(self) -> str:
        return "<unchanged>"


#: set_limits()' default for the lateness policy: left as it is.
UNCHANGED = Unchanged()


def limits(biz_type: str, *, using: str | None = None) -> Limits:
    """The limits in force for `biz_type` now: `set_limits()`' override, else the handler's own.
    `using`: the database (shard) to read them from; by default the first shard (every shard holds
    the same, as the functions below write them to every one)."""
    check_known(biz_type)
    row = fetch_one("limits_of", {"biz_type": biz_type}, using=connections[using or shards.aliases()[0]])
    if row is None:
        # Nothing stored yet: the handler's own values, which the next scan declares.
        rate_limit, concurrency, max_lateness, on_late = _declared(biz_type)
        return Limits(rate_limit, concurrency, False, max_lateness, on_late)
    return Limits(row["rate_limit"], row["concurrency"], row["paused"], row["max_lateness"], row["on_late"])


def set_limits(biz_type: str, rate_limit: float | None = None, concurrency: int | None = None, *,
               max_lateness: timedelta | None | Unchanged = UNCHANGED, on_late: str | Unchanged = UNCHANGED,
               using: str | None = None) -> None:
    """Replace the handler's own limits of `biz_type` with these (None: no limit), in the database,
    until the next set_limits() or reset_limits(). In force at every claimer's next claim. A rate
    from one start a day to a million a second, a concurrency from 1 to a million (validation.py);
    else InvalidOption, and nothing is stored.

    `max_lateness` and `on_late`, when either is given, replace the handler's lateness policy (the
    one not given is None, "run"), in force at every worker's next start; a call that gives only
    them leaves rate_limit and concurrency as they are, and one that gives neither leaves the policy."""
    check_known(biz_type)
    changes = []
    policy_given = max_lateness is not UNCHANGED or on_late is not UNCHANGED
    if not policy_given or rate_limit is not None or concurrency is not None:
        changes.append(("override_limits", {"rate_limit": check_rate_limit(rate_limit, InvalidOption),
                                            "concurrency": check_concurrency(concurrency, InvalidOption)}))
    if policy_given:
        max_lateness, on_late = check_lateness_policy(None if max_lateness is UNCHANGED else max_lateness,
                                                      "run" if on_late is UNCHANGED else on_late, InvalidOption)
        changes.append(("override_lateness", {"max_lateness": max_lateness, "on_late": on_late}))
    _change_all(changes, biz_type, using)


def reset_limits(biz_type: str, *, using: str | None = None) -> None:
    """Drop set_limits()' override of `biz_type`: the handler's own limits are in force again."""
    check_known(biz_type)
    _change("reset_limits", biz_type, using)


def pause(biz_type: str, *, using: str | None = None) -> None:
    """No task of `biz_type` is claimed until resume(); tasks already claimed or running finish as
    usual. Its due tasks wait, PENDING, and count as late."""
    check_known(biz_type)
    _change("pause_biz_type", biz_type, using, paused=True)


def resume(biz_type: str, *, using: str | None = None) -> None:
    """Undo pause(): the due tasks of `biz_type` are claimed again, oldest first, within its limits."""
    check_known(biz_type)
    _change("pause_biz_type", biz_type, using, paused=False)


def declare(connection=None) -> int:
    """Write the limits that this process's handlers declare into the table, where they differ
    from what is stored (one read when nothing changed), on `connection` (default: the one
    timeouts' statements use in this thread). Returns how many biz_types changed."""
    declared = {biz_type: _own(handler) for biz_type, handler in registered().items()}
    connection = connection or worker_connection.current()
    stored = {row["biz_type"]: (row["declared_rate_limit"], row["declared_concurrency"],
                                row["declared_max_lateness"], row["declared_on_late"])
              for row in fetch_dicts("declared_limits", using=connection)}
    changed = {biz_type: values for biz_type, values in declared.items()
               if stored.get(biz_type, NOTHING_DECLARED) != values}
    if changed:
        columns = [list(column) for column in zip(*changed.values(), strict=True)]
        execute("declare_limits", {"biz_types": list(changed), **dict(zip(DECLARED_ARRAYS, columns, strict=True))},
                using=connection).close()
    return len(changed)


# What a handler without limits nor a lateness policy declares, as a biz_type without a row has.
NOTHING_DECLARED = (None, None, None, "run")
# declare_limits' arrays of those values, in that order.
DECLARED_ARRAYS = ("rate_limits", "concurrencies", "max_latenesses", "on_lates")


def _own(handler):
    return handler.rate_limit, handler.concurrency, handler.max_lateness, handler.on_late


def _declared(biz_type):
    handler = find_handler(biz_type)
    return NOTHING_DECLARED if handler is None else _own(handler)


def _change(query, biz_type, using, **values):
    _change_all([(query, values)], biz_type, using)


def _change_all(changes, biz_type, using):
    """The changes, [(query, values)], on `using`, else on every shard (each shard's claims read its
    own table), together on each."""
    rate_limit, concurrency, max_lateness, on_late = _declared(biz_type)
    declared = {"biz_type": biz_type, "declared_rate_limit": rate_limit, "declared_concurrency": concurrency,
                "declared_max_lateness": max_lateness, "declared_on_late": on_late, **notify_params()}
    for alias in shards.aliases() if using is None else (using,):
        with transaction.atomic(using=alias):
            for query, values in changes:
                execute(query, {**declared, **values}, using=connections[alias]).close()
