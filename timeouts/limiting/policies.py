"""The lateness policies of biz_types as the operators' pages show them (lateness.py): what is in
force, what the handler declares, and whether set_limits() overrides it. One read of the limits
table for every biz_type; a biz_type without a row has its handler's own policy, as
timeouts.limits() answers."""

from dataclasses import dataclass
from datetime import timedelta

from django.db import DEFAULT_DB_ALIAS, connections

from timeouts.registry import find_handler
from timeouts.store.queries import fetch_dicts


@dataclass(frozen=True)
class Policy:
    max_lateness: timedelta | None  # in force; None: no limit
    on_late: str
    handler_max_lateness: timedelta | None  # what the handler declares (@timeouts.handler)
    handler_on_late: str
    overridden: bool  # set_limits() replaced the handler's policy


def policies(biz_types, *, using=DEFAULT_DB_ALIAS) -> dict[str, Policy]:
    """The policy of each of `biz_types`."""
    stored = {row["biz_type"]: row for row in fetch_dicts("lateness_policies", using=connections[using])}
    return {biz_type: _policy(biz_type, stored.get(biz_type)) for biz_type in biz_types}


def _policy(biz_type, row) -> Policy:
    if row is None:
        handler = find_handler(biz_type)
        own = (None, "run") if handler is None else (handler.max_lateness, handler.on_late)
        return Policy(*own, *own, False)
    return Policy(row["max_lateness"], row["on_late"], row["declared_max_lateness"], row["declared_on_late"],
                  row["lateness_overridden"])
