"""Each biz_type's limits, pause and overdue tasks outside the admin: `manage.py timeouts_stats`
(text and JSON) and the Prometheus gauges, against what timeouts.limits() says."""

import io
import json
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import call_command
from django.test import override_settings
from django.urls import path
from prometheus_client.parser import text_string_to_metric_families

import timeouts
from tests.support.factories import make_task
from timeouts import metrics, registry, stats
from timeouts.models import TimeoutTask
from timeouts.store import clock

Status = TimeoutTask.Status

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(60)]
urlpatterns = [path("metrics/timeouts", metrics.metrics_view)]


@pytest.fixture
def limited():
    """test.limited declares limits; test.fail has an override and test.slow is paused, with a task
    running and one dispatched; test.record has two overdue tasks."""
    registry.handler("test.limited", rate_limit=5, concurrency=2)(limited)
    timeouts.set_limits("test.fail", rate_limit=10, concurrency=None)
    timeouts.pause("test.slow")
    for i in range(2):
        TimeoutTask.objects.schedule("test.record", i, at=datetime.now(UTC) - timedelta(minutes=1))
    make_task(Status.RUNNING, biz_type="test.slow", biz_id="running")
    make_task(Status.DISPATCHED, biz_type="test.slow", biz_id="dispatched")
    yield
    registry.unregister("test.limited")


def test_biz_types_say_what_timeouts_limits_says(limited):
    found = {b.name: b for b in stats.biz_types(clock.database_now())}
    for name in ("test.limited", "test.fail", "test.slow", "test.record"):
        in_force = timeouts.limits(name)
        assert (found[name].limits.rate_limit, found[name].limits.concurrency, found[name].limits.paused) == (
            in_force.rate_limit, in_force.concurrency, in_force.paused)
    assert found["test.fail"].limits.overridden and found["test.fail"].sources == ("handler", "limits")
    assert found["test.record"].overdue == stats.Count(2, True)
    assert found["test.slow"].running == stats.Count(1, True) and found["test.record"].running == stats.Count(0, True)
    assert found["test.record"].sources == ("handler", "waiting")


def test_timeouts_stats_lists_limits_pause_and_overdue(limited):
    out = io.StringIO()
    call_command("timeouts_stats", stdout=out)
    lines = {line.split()[0]: line for line in out.getvalue().splitlines() if line.startswith("  test.")}
    assert "paused" in lines["test.slow"].split()
    assert "rate_limit 5/s" in lines["test.limited"] and "concurrency 2" in lines["test.limited"]
    assert "rate_limit 10/s" in lines["test.fail"]
    assert "(set_limits(); the handler's: rate_limit none, concurrency none)" in lines["test.fail"]
    assert lines["test.record"].split()[-1] == "2"
    assert "running      1" in lines["test.slow"]

    out = io.StringIO()
    call_command("timeouts_stats", "--json", stdout=out)
    rows = {row["biz_type"]: row for row in json.loads(out.getvalue())["biz_types"]}
    assert rows["test.fail"] | {"sources": None} == {
        "biz_type": "test.fail", "sources": None, "rate_limit": 10.0, "concurrency": None, "paused": False,
        "handler_rate_limit": None, "handler_concurrency": None, "overridden": True,
        "rate_part": None, "concurrency_part": None,  # one shard: the whole limit, no part
        "overdue": 0, "overdue_exact": True, "running": 0, "running_exact": True}


@override_settings(ROOT_URLCONF=__name__)
def test_the_gauges_per_biz_type(limited, client):
    response = client.get("/metrics/timeouts")
    samples = {(sample.name, sample.labels.get("biz_type")): sample.value
               for family in text_string_to_metric_families(response.content.decode()) for sample in family.samples}
    assert samples[("timeouts_paused", "test.slow")] == 1.0 and samples[("timeouts_paused", "test.record")] == 0.0
    assert samples[("timeouts_rate_limit", "test.limited")] == 5.0
    assert samples[("timeouts_concurrency_limit", "test.limited")] == 2.0
    assert samples[("timeouts_rate_limit", "test.fail")] == 10.0
    assert ("timeouts_concurrency_limit", "test.fail") not in samples  # no limit
    assert samples[("timeouts_biz_type_overdue_tasks", "test.record")] == 2.0
    assert samples[("timeouts_biz_type_overdue_tasks", "test.fail")] == 0.0
    assert samples[("timeouts_biz_type_running_tasks", "test.slow")] == 1.0
