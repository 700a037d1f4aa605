"""The limit rules of sql/migrations/0001_limits.sql, which the claim, the dispatcher's deadline, the
stats and the sharing of limits all read: the bounds of a limit, a shard's part of it, the token
bucket; and that PostgreSQL inlines them into the claim, so they cost no function call per row."""

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from timeouts import registry
from timeouts.store import queries

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(120)]

FUNCTIONS = ("timeouts_rate_in_bounds", "timeouts_concurrency_in_bounds", "timeouts_rate_part",
             "timeouts_concurrency_split", "timeouts_concurrency_part", "timeouts_bucket_size",
             "timeouts_bucket_tokens", "timeouts_bucket_full_at")


def one(sql, params=()):
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()[0]


def test_a_limit_is_read_within_the_bounds_the_api_accepts():
    assert one("SELECT timeouts_rate_part(1e300, NULL, 1)") == 1e6
    assert one("SELECT timeouts_rate_part(1e-300, NULL, 1)") == pytest.approx(1 / 86400)
    assert one("SELECT timeouts_rate_part(50, NULL, 1)") == 50
    assert one("SELECT timeouts_rate_part(NULL, 0.5, 2)") is None
    assert one("SELECT timeouts_concurrency_part(2147483647, NULL, 0, 1)") == 1_000_000
    assert one("SELECT timeouts_concurrency_part(2147483647, NULL, 7, 8)") == 125_000
    assert one("SELECT timeouts_concurrency_part(NULL, 0.5, 0, 2)") is None


def test_a_rate_part_is_the_stored_fraction_or_an_even_one_and_never_below_a_millionth():
    assert one("SELECT timeouts_rate_part(300, 0.5, 1)") == 300  # one shard: the whole
    assert one("SELECT timeouts_rate_part(300, NULL, 3)") == pytest.approx(100)
    assert one("SELECT timeouts_rate_part(300, 0.9, 3)") == pytest.approx(270)
    assert one("SELECT timeouts_rate_part(1e6, 5e-324, 3)") == pytest.approx(1)


def test_even_concurrency_parts_add_up_to_the_limit():
    # Every limit up to a thousand, on up to eight shards: the even parts add up to it, one apart at most.
    assert one("""
        SELECT count(*) FROM (
            SELECT l, n, sum(part) AS total, max(part) - min(part) AS spread
            FROM generate_series(1, 1000) AS l, generate_series(1, 8) AS n, generate_series(0, n - 1) AS i,
                 LATERAL (SELECT timeouts_concurrency_part(l, NULL, i, n) AS part) AS p
            GROUP BY l, n
        ) AS parts
        WHERE total <> l OR spread > 1""") == 0


def test_a_part_stored_as_a_fraction_reads_back_as_the_same_number_of_tasks():
    # As limit_shares.py stores it: tasks / limit, computed in float8 as Python computes it.
    assert one("""
        SELECT count(*)
        FROM (SELECT l FROM generate_series(1, 2000) AS l UNION ALL SELECT unnest(ARRAY[99991, 100000, 1000000])) AS s,
             LATERAL generate_series(0, l, greatest(1, l / 2000)) AS k
        WHERE timeouts_concurrency_part(l, k::float8 / l, 0, 3) <> k""") == 0


def test_the_token_bucket_holds_a_twentieth_of_a_second_and_at_least_one():
    assert one("SELECT timeouts_bucket_size(100)") == 5
    assert one("SELECT timeouts_bucket_size(10)") == 1
    at = datetime(2026, 1, 1, tzinfo=UTC)
    # Never used: full. Refilled at the rate since, up to its size.
    assert one("SELECT timeouts_bucket_tokens(100, 0, NULL, %s)", [at]) == 5
    assert one("SELECT timeouts_bucket_tokens(100, 0, %s, %s)", [at, at + timedelta(milliseconds=20)]) == (
        pytest.approx(2))
    assert one("SELECT timeouts_bucket_tokens(100, 1, %s, %s)", [at, at + timedelta(hours=1)]) == 5
    assert one("SELECT timeouts_bucket_tokens(100, 1, %s, %s)", [at, at - timedelta(hours=1)]) == 1
    assert one("SELECT timeouts_bucket_tokens(NULL, 1, %s, %s)", [at, at]) is None
    # Full again once refilled to its size; NULL when full, or without a rate limit.
    assert one("SELECT timeouts_bucket_full_at(100, 0, %s)", [at]) == at + timedelta(milliseconds=50)
    assert one("SELECT timeouts_bucket_full_at(100, 5, %s)", [at]) is None
    assert one("SELECT timeouts_bucket_full_at(100, 0, NULL)") is None
    assert one("SELECT timeouts_bucket_full_at(NULL, 0, %s)", [at]) is None


def literal(value) -> str:
    """A parameter as SQL text, for EXECUTE: a list is a text array."""
    if isinstance(value, list):
        return f"ARRAY[{', '.join(map(repr, value))}]::text[]"
    return repr(value)


@pytest.mark.parametrize("name", ["claim_due", "claimable_deadline", "limit_demand", "stored_limits"])
@pytest.mark.parametrize("plan", ["force_custom_plan", "force_generic_plan"])
def test_the_functions_are_inlined_into_the_queries_that_read_them(name, plan):
    sql = queries.QUERIES[name]
    names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", sql)))
    positional = re.sub(r"%\((\w+)\)s", lambda m: f"${names.index(m.group(1)) + 1}", sql).replace("%%", "%")
    params = {"limit": 100, "lead": 0.0, "max_dispatched": 1000, "shard_index": 1, "shard_count": 3,
              "concurrency_poll": 0.15, "horizon": 10, "cap": 100,
              "attribute_prefixes": list(registry.attribute_prefixes())}
    with connection.cursor() as cursor:
        cursor.execute(f"SET plan_cache_mode = {plan}")
        cursor.execute(f"PREPARE inlined AS {positional}")
        try:
            cursor.execute(f"EXPLAIN (VERBOSE) EXECUTE inlined({', '.join(literal(params[n]) for n in names)})")
            text = "\n".join(row[0] for row in cursor.fetchall())
        finally:
            cursor.execute("DEALLOCATE inlined")
            cursor.execute("RESET plan_cache_mode")
    assert not [function for function in FUNCTIONS if function in text], text
