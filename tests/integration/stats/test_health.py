"""`manage.py timeouts_health` on one database: a healthy deployment exits 0 with one line; due tasks
that wait too long, nothing claiming while tasks are due and missing partitions each exit 1 with a
line that says so; a paused biz_type's tasks are not late; the liveness and readiness probes run
their own checks. The checks read on connections of their own, so every test commits."""

import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

import timeouts
from tests.integration.stats.claims_noted import claimed, forget_claims, run
from tests.support.isolation import no_limits  # noqa: F401 (a fixture)
from timeouts.conf import get_settings
from timeouts.dispatch.scan import scan
from timeouts.stats import health
from timeouts.storage import partitions
from timeouts.store import last_claims

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]


@pytest.fixture(autouse=True)
def no_claims_noted(transactional_db, monkeypatch):
    """No claim on the table, and none remembered by this process (its once-a-second throttle)."""
    monkeypatch.setattr(last_claims, "_noted", {})
    forget_claims()
    yield
    forget_claims()


def due(biz_id, ago, biz_type="test.record"):
    return timeouts.schedule(biz_type, biz_id, at=datetime.now(UTC) - ago)


def test_a_healthy_deployment_exits_0_with_one_line():
    code, out, err = run()
    assert (code, err) == (0, "")
    assert re.fullmatch(r"OK: 1 shard read; no task due; no claim noted yet; "
                        r"partitions through \d{4}-\d\d-\d\d 00:00 UTC\n", out), out
    scan()  # nothing due to claim, but the scan notes that it claimed
    code, out, err = run()
    assert (code, err) == (0, "")
    assert re.fullmatch(r"OK: 1 shard read; no task due; last claim \S+ m?s ago \(scan\); "
                        r"partitions through \S+ 00:00 UTC\n", out), out


def test_a_due_task_that_waits_too_long_fails_with_how_long_it_waited():
    late = due("late", timedelta(minutes=5))
    due("later", timedelta(minutes=1))
    claimed()  # something claims: only the lateness is wrong
    code, out, err = run("--max-lateness", "120")
    assert (code, out) == (1, "")
    assert re.fullmatch(rf"tasks wait too long: the oldest due task, job {late.job_id} \(test.record:late\), has "
                        r"waited 5 min \d+ s, more than 2 min 0 s; 2 tasks due\n", err), err
    code, out, err = run("--max-lateness", "600")
    assert (code, err) == (0, "")
    assert "oldest due task waited 5 min" in out and "(limit 10 min 0 s)" in out


def test_the_default_lateness_comes_from_the_scan_interval(settings):
    assert health.Thresholds.defaults().max_lateness == 60.0
    settings.TIMEOUTS = {**settings.TIMEOUTS, "SCAN_INTERVAL": 30.0}
    assert health.Thresholds.defaults() == health.Thresholds(90.0, 90.0, get_settings().PARTITIONS_AHEAD - 1)
    due("late", timedelta(seconds=80))
    claimed()
    assert run()[0] == 0
    assert run("--max-lateness", "70")[0] == 1


def test_nothing_claiming_while_tasks_are_due_fails():
    due("waiting", timedelta(minutes=2))
    code, _, err = run("--max-lateness", "3600")
    assert code == 1
    assert re.fullmatch(r"nothing claims: no dispatcher or scan has ever claimed here, and a due task has "
                        r"waited 2 min \d+ s\n", err), err
    claimed(ago=600, claimer="dispatcher")
    code, _, err = run("--max-lateness", "3600")
    assert code == 1
    assert re.fullmatch(r"nothing claims: no dispatcher or scan has claimed for 10 min \d+ s \(the last, a "
                        r"dispatcher on test-host:1\), more than 30.00 s, and a due task has waited 2 min \d+ s\n",
                        err), err
    claimed(ago=1, claimer="scan")  # the freshest claim counts, whoever made it
    assert run("--max-lateness", "3600")[0] == 0


def test_no_claim_is_needed_while_no_task_has_waited_the_gap():
    claimed(ago=3600)
    due("just-due", timedelta(seconds=1))
    due("future", -timedelta(minutes=5))
    code, out, _ = run()
    assert code == 0 and re.search(r"; last claim 60 min \d+ s ago \(scan\);", out), out


@pytest.mark.usefixtures("no_limits")
def test_a_paused_biz_type_s_tasks_wait_on_purpose():
    due("paused", timedelta(minutes=30), biz_type="test.fail")
    other = due("other", timedelta(seconds=10))
    claimed()
    assert run()[0] == 1
    timeouts.pause("test.fail")
    code, out, err = run("--json")
    assert (code, err) == (0, "")
    shard = json.loads(out)["shards"]["default"]
    assert shard["paused"] == ["test.fail"] and shard["oldest_due"]["job_id"] == other.job_id
    assert 9 < shard["oldest_due"]["age_seconds"] < 60


def test_missing_partitions_are_named():
    now = datetime.now(UTC)
    interval = get_settings().PARTITION_INTERVAL
    start = partitions.bucket_start(now, interval)
    two_ahead = partitions.next_bucket(partitions.next_bucket(start, interval), interval)
    name = partitions.partition_name(two_ahead, interval)
    with connection.cursor() as cursor:
        cursor.execute(f'DROP TABLE "{name}"')
    try:
        code, _, err = run()
        assert code == 1
        ahead = get_settings().PARTITIONS_AHEAD - 1
        assert err == (f"partitions missing: {name}, of the current bucket and the {ahead} after it; tasks due then "
                       "go to the DEFAULT partition\n")
        code, out, _ = run("--partitions-ahead", "1")
        assert code == 0 and f"partitions through {two_ahead:%Y-%m-%d %H:%M} UTC" in out
    finally:
        partitions.maintain("default")
    assert run()[0] == 0


def test_every_problem_is_one_line_and_json_has_them_all():
    late = due("late", timedelta(minutes=5))
    code, out, err = run("--json")
    assert (code, err) == (1, "")
    document = json.loads(out)
    assert not document["ok"] and document["checks"] == ["read", "lateness", "claims", "partitions"]
    assert [(p["check"], p["shard"]) for p in document["problems"]] == [("lateness", "default"), ("claims", "default")]
    shard = document["shards"]["default"]
    assert shard["read"] and shard["error"] is None and shard["last_claims"] == []
    assert shard["oldest_due"]["job_id"] == late.job_id and shard["due"] == {"count": 1, "exact": True}
    assert shard["missing_partitions"] == [] and document["thresholds"]["max_lateness"] == 60.0
    code, out, err = run()
    assert len(err.splitlines()) == 2 and out == ""


def test_liveness_checks_only_that_something_claims_and_readiness_only_that_it_can_read():
    due("late", timedelta(minutes=5))
    claimed()
    code, out, _ = run("--liveness")  # late, but claims go on: a restart would not help
    assert code == 0 and out.startswith("OK: 1 shard read; last claim")
    assert "partitions" not in out and "due" not in out
    claimed(ago=120)
    assert run("--liveness")[0] == 1
    code, out, _ = run("--readiness")
    assert (code, out) == (0, "OK: 1 shard read\n")


def test_bad_options_are_refused_with_status_2():
    from django.core.management import CommandError

    with pytest.raises(CommandError, match="--max-lateness: must be a number of seconds above 0, got '0'"):
        run("--max-lateness", "0")
    with pytest.raises(CommandError, match="--partitions-ahead: must be 0 or more"):
        run("--partitions-ahead", "-1")
    with pytest.raises(CommandError, match="unknown database alias 'nowhere'") as raised:
        run("--database", "nowhere")
    assert raised.value.returncode == 2
    with pytest.raises(CommandError):
        run("--liveness", "--readiness")
