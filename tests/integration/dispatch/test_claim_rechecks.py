"""A claim that finds rows another claimer took since its snapshot: PostgreSQL rechecks each such
row (EvalPlanQual), passes it over, and the claim takes every other row it chose, whatever partition
holds it. On PostgreSQL 18 a recheck sets the claim's WITH queries up again, sharing their run-time
partition pruning with the statement: the claim prunes as it runs only outside them (claims.sql,
claim_due), or the server crashes, or the claim leaves rows it locked unclaimed."""

import threading
import time
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from django.db import connection

from tests.support.isolation import no_limits  # noqa: F401  (a fixture)
from timeouts import registry
from timeouts.models import TimeoutTask
from timeouts.store.queries import QUERIES

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60), pytest.mark.usefixtures("no_limits")]
Status = TimeoutTask.Status

PARAMS = {"limit": 50, "lead": 0.0, "max_dispatched": 10_000, "attribute_prefixes": registry.attribute_prefixes(),
          "shard_index": 0, "shard_count": 1}
CLOCK = "SELECT now() + %(lead)s * interval '1 second' AS due_by"
# The claim, paused after its snapshot is taken and before its scans lock a row: its clock comes first.
PAUSED_CLAIM = QUERIES["claim_due"].replace(CLOCK, f"{CLOCK} FROM (SELECT pg_sleep(1)) AS pause")


def backlog(biz_type, n, *, seconds_ago):
    start = datetime.now(UTC) - timedelta(seconds=seconds_ago)
    TimeoutTask.objects.bulk_schedule(
        [{"biz_type": biz_type, "biz_id": f"{biz_type}-{seconds_ago}-{i}", "at": start + timedelta(milliseconds=i)}
         for i in range(n)])


def psycopg_connection():
    params = {key: value for key, value in connection.get_connection_params().items()
              if key not in ("cursor_factory", "context")}
    return psycopg.connect(**params, autocommit=True)


def test_a_claim_that_meets_rows_taken_since_its_snapshot_claims_every_other_row_it_chose():
    for biz_type in ("test.record", "test.fail", "test.slow"):
        backlog(biz_type, 30, seconds_ago=60)
    backlog("test.record", 5, seconds_ago=60 * 86400)  # the oldest, in DEFAULT: no partition covers their day
    assert CLOCK in QUERIES["claim_due"]
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM timeouts_task_default")
        assert cursor.fetchone()[0] == 5
    paused = {}
    with psycopg_connection() as first, psycopg_connection() as other:

        def claim_paused():
            paused["rows"] = first.execute(PAUSED_CLAIM, PARAMS).fetchall()

        thread = threading.Thread(target=claim_paused)
        thread.start()
        time.sleep(0.3)
        # The oldest task of each biz_type, one in DEFAULT, claimed and committed meanwhile.
        taken = other.execute(QUERIES["claim_due"], {**PARAMS, "limit": 3}).fetchall()
        thread.join(30)
    assert len(taken) == 3
    assert len(paused["rows"]) == 50, "every row the paused claim chose and locked is claimed"
    assert TimeoutTask.objects.filter(status=Status.DISPATCHED).count() == 53
    assert not {row[0] for row in taken} & {row[0] for row in paused["rows"]}
