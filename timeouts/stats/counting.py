"""Counting without reading every row: exact while that is cheap, else the planner's estimate.

`count()` counts a queryset (the admin's changelist and filters) exactly only while that is cheap:
it asks the planner first what counting at most `exact_limit` rows would cost, counts only below
`max_cost`, and otherwise (or when there are more rows than the limit) answers with the planner's
estimate, which comes from the catalog and each partition's statistics (`reltuples`, `relpages`,
`pg_statistic`). `bounded_count()` does the same for a named query an index serves.
"""

import json
from dataclasses import dataclass

from django.core.exceptions import EmptyResultSet
from django.db import DEFAULT_DB_ALIAS, connections

from timeouts.store.queries import QUERIES, fetch_one

EXACT_LIMIT = 1000  # admin: counts up to this are exact
MAX_COST = 20_000.0  # planner cost units a "cheap" exact count may take (a few ms of work)


@dataclass(frozen=True)
class Count:
    value: int
    exact: bool

    def __str__(self):
        return f"{self.value:,}" if self.exact else f"~{self.value:,}"

    def __add__(self, other):
        """Counts of several shards add up: exact if each one is."""
        return Count(self.value + other.value, self.exact and other.exact)


def _sql(queryset):
    compiler = queryset.query.get_compiler(using=queryset.db)
    return compiler.as_sql()


def plan(sql, params, using=DEFAULT_DB_ALIAS) -> dict:
    """The top node of the planner's plan for `sql` (EXPLAIN, nothing is run)."""
    with connections[using].cursor() as cursor:
        cursor.execute("EXPLAIN (FORMAT JSON) " + sql, params)
        document = cursor.fetchone()[0]
    if isinstance(document, str):
        document = json.loads(document)
    return document[0]["Plan"]


def count(queryset, *, exact_limit=EXACT_LIMIT, max_cost=MAX_COST) -> Count:
    """How many rows `queryset` has: exact up to `exact_limit` when counting is cheap, else the
    planner's estimate (never below what was counted)."""
    using = queryset.db
    rows = queryset.order_by().values("pk")
    try:
        inner, params = _sql(rows[: exact_limit + 1])
    except EmptyResultSet:  # e.g. queryset.none()
        return Count(0, True)
    bounded = f"SELECT count(*) FROM ({inner}) AS bounded"
    counted = None
    if plan(bounded, params, using)["Total Cost"] <= max_cost:
        with connections[using].cursor() as cursor:
            cursor.execute(bounded, params)
            counted = cursor.fetchone()[0]
        if counted <= exact_limit:
            return Count(counted, True)
    estimate = round(plan(*_sql(rows), using)["Plan Rows"])
    return Count(max(estimate, counted or 0), False)


def estimated_rows(name, params=None, using=DEFAULT_DB_ALIAS) -> int:
    """The planner's estimate of the rows named query `name` reads: under its LIMIT if it has one
    (a bounded count), else what it returns. Nothing is run."""
    top = node = plan(QUERIES[name], params or {}, using)
    while node.get("Node Type") != "Limit" and node.get("Plans"):
        node = node["Plans"][0]
    if node.get("Node Type") != "Limit":
        # No LIMIT: what the whole statement returns (its first child, down the tree, would be
        # one partition of an Append).
        return round(top["Plan Rows"])
    return round(node["Plans"][0]["Plan Rows"])


def bounded_count(name, *, limit, using=DEFAULT_DB_ALIAS) -> Count:
    """Run named query `name`, a count of at most its `limit` parameter's rows: exact up to `limit`
    rows, else the planner's estimate. For queries that an index serves (the caller knows): no cost
    guard."""
    params = {"limit": int(limit) + 1}
    counted = fetch_one(name, params, using=connections[using])["n"]
    if counted <= limit:
        return Count(counted, True)
    return Count(max(counted, estimated_rows(name, params, using)), False)
