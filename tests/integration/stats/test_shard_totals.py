"""`manage.py timeouts_stats` and the metrics over three shards (three test databases): totals are
the sums over the shards, each shard's own numbers are shown beside them, the lateness percentiles
are computed again over every shard's tasks, and a shard that cannot be read is shown as such while
the others still count."""

import io
import itertools
import json
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import CommandError, call_command
from django.db import connections
from django.test import override_settings
from django.urls import path
from prometheus_client.parser import text_string_to_metric_families

import timeouts
from tests.support.shards import ALIASES, key_on, three_shards, unreachable  # noqa: F401 (an autouse fixture)
from timeouts import metrics
from timeouts.models import TimeoutTask
from timeouts.stats import shard_totals

Status = TimeoutTask.Status
pytestmark = [pytest.mark.django_db(transaction=True, databases=ALIASES), pytest.mark.timeout(60)]
urlpatterns = [path("metrics/timeouts", metrics.metrics_view)]


@pytest.fixture
def spread():
    """On each shard, tasks whose numbers differ from the other shards': "default" 2 overdue (10
    and 1 min) and 1 later; "shard_b" the oldest overdue (20 min) and 2 started (0.1 s and 10 s
    late); "shard_c" 2 started (0.2 s and 0.3 s late) and 1 cancelled."""
    names = (f"t-{n}" for n in itertools.count())
    ago = lambda minutes: datetime.now(UTC) - timedelta(minutes=minutes)  # noqa: E731
    schedule = lambda alias, **when: timeouts.schedule("test.record", key_on(alias, next(names)), **when)  # noqa: E731
    schedule("default", at=ago(10))
    schedule("default", at=ago(1))
    schedule("default", delay=3600)
    oldest = schedule("shard_b", at=ago(20))
    for alias, late in (("shard_b", 0.1), ("shard_b", 10.0), ("shard_c", 0.2), ("shard_c", 0.3)):
        started(schedule(alias, at=ago(2)), late)
    assert schedule("shard_c", delay=600).cancel()
    return oldest


def test_the_totals_are_the_sums_over_the_shards_and_each_shard_has_its_own(spread):
    data = stats_json()
    assert list(data["shards"]) == ALIASES
    assert counts(data) == {("pending", "test.record"): 4, ("running", "test.record"): 4,
                            ("cancelled", "test.record"): 1}
    assert [counts(data["shards"][alias]) for alias in ALIASES] == [
        {("pending", "test.record"): 3},
        {("pending", "test.record"): 1, ("running", "test.record"): 2},
        {("running", "test.record"): 2, ("cancelled", "test.record"): 1}]
    assert data["counts"]["how"] == "exact"
    oldest = data["oldest_overdue"]
    assert (oldest["job_id"], oldest["shard"]) == (spread.job_id, "shard_b")
    assert data["default_partition"] == {"rows": 0, "exact": True}
    [record] = [b for b in data["biz_types"] if b["biz_type"] == "test.record"]
    assert (record["overdue"], record["running"]) == (3, 4)
    assert [b["overdue"] for alias in ALIASES for b in data["shards"][alias]["biz_types"]
            if b["biz_type"] == "test.record"] == [2, 1, 0]
    assert "partitions" not in data and all(data["shards"][alias]["partitions"] for alias in ALIASES)


def test_the_lateness_percentiles_are_those_of_every_shards_tasks_together(spread):
    data = stats_json()
    late = data["lateness"]
    # percentile_cont over 0.1, 0.2, 0.3 and 10.0, wherever each one is.
    assert (late["started"], late["waiting"], late["due"]) == (4, 2, 6)
    assert late["p50"] == pytest.approx(0.25) and late["p90"] == pytest.approx(7.09)
    assert late["max"] == 10.0 and late["percentiles_exact"]
    assert data["shards"]["shard_b"]["lateness"]["p50"] == pytest.approx(5.05)  # its own two


def test_past_the_points_a_shard_sends_the_merged_percentiles_are_close(monkeypatch):
    names = (f"late-{n}" for n in itertools.count())
    for alias, lateness in (("default", range(1, 101)), ("shard_b", range(101, 201))):
        for late in lateness:
            started(timeouts.schedule("test.record", key_on(alias, next(names)),
                                      at=datetime.now(UTC) - timedelta(minutes=2)), late / 100)
    monkeypatch.setattr(shard_totals, "LATENESS_POINTS", 21)  # quantiles every 5 tasks
    late = stats_json()["lateness"]
    assert late["started"] == 200 and not late["percentiles_exact"]
    assert late["p50"] == pytest.approx(1.005, abs=0.02) and late["p90"] == pytest.approx(1.801, abs=0.02)
    assert late["max"] == 2.0


def test_the_text_report_shows_the_totals_and_a_line_per_shard(spread):
    out = io.StringIO()
    call_command("timeouts_stats", stdout=out)
    text = out.getvalue()
    assert text.startswith("Shards: default, shard_b, shard_c.\n")
    assert "running    test.record" in text and "totals: cancelled 1, pending 4, running 4" in text
    assert f"Oldest overdue task: job {spread.job_id} test.record:{spread.biz_id} on shard shard_b" in text
    lines = text.split("Per shard")[1].splitlines()
    assert [line.split()[:6] for line in lines[2:]] == [
        ["default", "3", "3", "2", "0", "0"], ["shard_b", "3", "1", "1", "2", "0"],
        ["shard_c", "3", "0", "0", "2", "0"]]
    assert "Partitions (" not in text


def test_one_database_is_reported_alone_with_database():
    task = timeouts.schedule("test.record", key_on("shard_c"), delay=600)
    data = stats_json("--database", "shard_c")
    assert "shards" not in data and data["partitions"]
    assert data["counts"]["rows"] == [{"status": "pending", "biz_type": "test.record", "count": 1, "exact": True}]
    assert task._state.db == "shard_c"


def test_a_shard_that_cannot_be_read_is_named_and_the_others_still_count(spread):
    out = io.StringIO()
    with unreachable("shard_b"), pytest.raises(CommandError, match="could not read the shards shard_b"):
        call_command("timeouts_stats", "--json", stdout=out)
    data = json.loads(out.getvalue())  # printed in full before the command failed
    assert "connection" in data["shards"]["shard_b"]["error"]
    assert counts(data) == {("pending", "test.record"): 3, ("running", "test.record"): 2,
                            ("cancelled", "test.record"): 1}
    assert data["oldest_overdue"]["shard"] == "default" and data["lateness"]["started"] == 2
    out = io.StringIO()
    with unreachable("shard_b"), pytest.raises(CommandError):
        call_command("timeouts_stats", stdout=out)
    text = out.getvalue()
    assert "The totals below leave out shard_b: could not be read." in text
    assert "  shard_b cannot be read: " in text and "\n  shard_c " in text


def test_limits_that_differ_between_shards_are_pointed_out():
    timeouts.pause("test.record", using="shard_b")  # as if the other shards were down when it was paused
    data = stats_json()
    [record] = [b for b in data["biz_types"] if b["biz_type"] == "test.record"]
    assert record["paused"] is False and record["limits_differ_on"] == ["shard_b"]
    out = io.StringIO()
    call_command("timeouts_stats", stdout=out)
    assert "(other limits on shard_b: see --database ALIAS)" in out.getvalue()


@override_settings(ROOT_URLCONF=__name__)
def test_the_gauges_are_totals_and_each_shard_has_its_own(spread, client):
    samples = scrape(client)
    assert samples[("timeouts_pending_tasks", ())] == 4
    assert samples[("timeouts_overdue_tasks", ())] == 3
    assert 19 * 60 < samples[("timeouts_oldest_overdue_age_seconds", ())] < 25 * 60
    assert samples[("timeouts_biz_type_overdue_tasks", ("test.record",))] == 3
    assert samples[("timeouts_biz_type_running_tasks", ("test.record",))] == 4
    assert [samples[("timeouts_shard_up", (alias,))] for alias in ALIASES] == [1, 1, 1]
    assert [samples[("timeouts_shard_pending_tasks", (alias,))] for alias in ALIASES] == [3, 1, 0]
    assert [samples[("timeouts_shard_overdue_tasks", (alias,))] for alias in ALIASES] == [2, 1, 0]
    assert samples[("timeouts_shard_oldest_overdue_age_seconds", ("shard_c",))] == 0


@override_settings(ROOT_URLCONF=__name__)
def test_a_shard_that_is_down_shows_in_shard_up_and_the_others_still_count(spread, client, caplog):
    with unreachable("shard_b"):
        samples = scrape(client)
    assert [samples[("timeouts_shard_up", (alias,))] for alias in ALIASES] == [1, 0, 1]
    assert ("timeouts_shard_pending_tasks", ("shard_b",)) not in samples
    assert samples[("timeouts_pending_tasks", ())] == 3
    assert samples[("timeouts_overdue_tasks", ())] == 2
    assert "could not read the shard 'shard_b'" in caplog.text


@override_settings(ROOT_URLCONF=__name__)
def test_with_no_shard_answering_there_are_no_totals(client):
    with unreachable("default"), unreachable("shard_b"), unreachable("shard_c"):
        samples = scrape(client)
    assert [samples[("timeouts_shard_up", (alias,))] for alias in ALIASES] == [0, 0, 0]
    assert ("timeouts_pending_tasks", ()) not in samples


@override_settings(ROOT_URLCONF=__name__)
def test_one_shard_has_no_shard_gauges(client, settings):
    settings.TIMEOUTS = {**settings.TIMEOUTS, "SHARDS": ["default"]}
    samples = scrape(client)
    assert ("timeouts_pending_tasks", ()) in samples
    assert not any(name.startswith("timeouts_shard_") for name, _ in samples)


def test_a_weighted_quantile_is_percentile_cont_over_the_repeated_values():
    values = [0.1, 0.2, 0.3, 10.0]
    assert [shard_totals.weighted_quantile([(v, 1) for v in values], q) for q in (0, 0.5, 0.9, 1)] == pytest.approx(
        [0.1, 0.25, 7.09, 10.0])
    repeated = [(1.0, 3), (2.0, 3)]  # as 1, 1, 1, 2, 2, 2
    assert [shard_totals.weighted_quantile(repeated, q) for q in (0.2, 0.5, 0.8)] == pytest.approx([1.0, 1.5, 2.0])
    assert shard_totals.weighted_quantile([], 0.5) is None and shard_totals.weighted_quantile([(4.0, 1)], 0.99) == 4.0


# -- helpers -----------------------------------------------------------------------------------------


def started(task, late):
    """The task RUNNING on its shard, its first attempt started `late` seconds after its action_time."""
    with connections[task._state.db].cursor() as cursor:
        cursor.execute("UPDATE timeouts_task SET status = %s, attempts = 1, dispatched_at = now(), "
                       "started_at = action_time + %s * interval '1 second', lease_until = now() + interval '1 hour' "
                       "WHERE job_id = %s", [Status.RUNNING, late, task.job_id])
        assert cursor.rowcount == 1


def stats_json(*args):
    out = io.StringIO()
    call_command("timeouts_stats", "--json", *args, stdout=out)
    return json.loads(out.getvalue())


def counts(data):
    return {(row["status"], row["biz_type"]): row["count"] for row in data["counts"]["rows"]}


def scrape(client):
    """{(name, label values): value} of the view's samples."""
    response = client.get("/metrics/timeouts")
    assert response.status_code == 200
    return {(sample.name, tuple(sample.labels.values())): sample.value
            for family in text_string_to_metric_families(response.content.decode()) for sample in family.samples}
