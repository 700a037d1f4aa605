"""The fair claim's plan on a large skewed table: 10^6 due tasks of one biz_type and 10 of another.
The claim must read what it returns plus one probe per biz_type and partition, whatever the backlog,
in its custom plan and in the generic plan the prepared claim keeps; and its estimated cost must
stay under jit_above_cost, where JIT compiling the plan would cost more than the claim.

The backlog is built as a partition of its own, filled before it is attached (its indexes are then
built by sorting, in seconds, rather than entry by entry), and dropped afterwards. Plans do not
depend on Django's version: this runs once, with the reliability scenarios (leg 1)."""

import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection, transaction

import timeouts
from tests.support.isolation import no_limits  # noqa: F401  (a fixture)
from timeouts.durable import calls
from timeouts.store import queries

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300), pytest.mark.slow,
              pytest.mark.reliability, pytest.mark.usefixtures("no_limits")]

BACKLOG = 1_000_000
DAY = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=40)
PARTITION = f"timeouts_task_d{DAY:%Y%m%d}"
ONE_SHARD = {"shard_index": 0, "shard_count": 1}
# attribute_prefixes as an array literal: explain() spells each parameter with repr().
PARAMS = {"limit": 500, "lead": 0.0, "max_dispatched": 10_000, "attribute_prefixes": f"{{{calls.PREFIX}}}",
          **ONE_SHARD}


@pytest.fixture
def skewed_backlog():
    with connection.cursor() as cursor:
        cursor.execute(f"CREATE TABLE {PARTITION} (LIKE timeouts_task INCLUDING DEFAULTS INCLUDING CONSTRAINTS)")
        cursor.execute(f"""
            INSERT INTO {PARTITION} (job_id, biz_type, biz_id, action_time, run_at, max_attempts, ttr)
            SELECT nextval('timeouts_task_job_id_seq'), 'test.record', lpad(g::text, 8, '0'), t, t, 16, 60
            FROM (SELECT g, %(day)s::timestamptz + g * interval '10 ms' AS t
                  FROM generate_series(1, {BACKLOG}) AS g) AS s""", {"day": DAY})
        cursor.execute(f"""
            INSERT INTO {PARTITION} (job_id, biz_type, biz_id, action_time, run_at, max_attempts, ttr)
            SELECT nextval('timeouts_task_job_id_seq'), 'test.fail', g::text, t, t, 16, 60
            FROM (SELECT g, %(day)s::timestamptz + interval '20 hours' + g * interval '1 s' AS t
                  FROM generate_series(1, 10) AS g) AS s""", {"day": DAY})
        cursor.execute(f"ALTER TABLE timeouts_task ATTACH PARTITION {PARTITION} "
                       f"FOR VALUES FROM (%s) TO (%s)", [DAY, DAY + timedelta(days=1)])
        cursor.execute("ANALYZE timeouts_task")
    yield
    with connection.cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {PARTITION}")


def explain(sql, params, *, generic=False):
    """EXPLAIN ANALYZE of `sql` (Django's %(name)s parameters) as a custom or a generic plan, rolled back."""
    names = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", sql)))
    positional = re.sub(r"%\((\w+)\)s", lambda m: f"${names.index(m.group(1)) + 1}", sql).replace("%%", "%")
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL plan_cache_mode = {'force_generic_plan' if generic else 'force_custom_plan'}")
        cursor.execute(f"PREPARE fair_claim AS {positional}")
        try:
            arguments = ", ".join(repr(params[name]) for name in names)
            cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE fair_claim({arguments})")
            [plan] = cursor.fetchone()[0]
            cursor.execute("SELECT current_setting('jit_above_cost')::float8")
            jit_above_cost = cursor.fetchone()[0]
        finally:
            cursor.execute("DEALLOCATE fair_claim")
        transaction.set_rollback(True)
    return plan, jit_above_cost


def nodes(plan):
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def rows_read(plan):
    """Rows that scans of timeouts_task's partitions returned or threw away, over all loops."""
    return sum((node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)) * node.get("Actual Loops", 1)
               for node in nodes(plan) if node.get("Relation Name", "").startswith("timeouts_task"))


def test_the_fair_claim_reads_what_it_claims_whatever_the_backlog(skewed_backlog):
    for generic in (False, True):  # one backlog for both: it takes a while to build
        check_plan(*explain(queries.QUERIES["claim_due"], PARAMS, generic=generic))
    # With limits: the claim counts the running tasks, and a dispatcher whose claim left only
    # held-back tasks due asks when the next may be claimed.
    timeouts.pause("test.fail")
    timeouts.set_limits("test.record", rate_limit=10_000, concurrency=300)  # a burst of 500: the concurrency binds
    for generic in (False, True):
        plan, jit_above_cost = explain(queries.QUERIES["claim_due"], PARAMS, generic=generic)
        assert plan["Plan"]["Actual Rows"] == 300
        assert rows_read(plan["Plan"]) < 5 * 500, json.dumps(plan, indent=1)
        assert plan["Plan"]["Total Cost"] < jit_above_cost
        plan, _ = explain(queries.QUERIES["claimable_deadline"], {"concurrency_poll": 0.15, **ONE_SHARD},
                          generic=generic)
        assert rows_read(plan["Plan"]) < 100, json.dumps(plan, indent=1)


def check_plan(plan, jit_above_cost):
    root = plan["Plan"]
    assert root["Actual Rows"] == 500
    # The 10 tasks of the small biz_type are in this claim, beside 490 of the backlog: see
    # test_fair_claim. Here: what it cost to find them.
    assert rows_read(root) < 5 * 500, json.dumps(plan, indent=1)  # of 1,000,010 due
    # Index scans of the (biz_type, run_at) index (the lease index for the backpressure count),
    # and the TID scan that finds the claimed rows again: never a sequential scan.
    scanned = {(node["Node Type"], node.get("Index Name"))
               for node in nodes(root) if node.get("Relation Name") == PARTITION}
    allowed = {f"{PARTITION}_biz_type_run_at_idx", f"{PARTITION}_lease_until_idx"}
    assert all(kind == "Tid Scan" or index in allowed for kind, index in scanned), scanned
    assert root["Total Cost"] < jit_above_cost
    assert "JIT" not in plan
