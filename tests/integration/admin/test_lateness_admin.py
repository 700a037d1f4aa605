"""The lateness policy in the admin: the businesses page shows it and changes it (each change in the
admin log, bad input refused and nothing changed), and the task list's "ended late" filter."""

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.admin.models import CHANGE, LogEntry

import timeouts
from tests.integration.admin.test_businesses import URL, changer, rows_by_biz_type, viewer  # noqa: F401  (fixtures)
from tests.support.isolation import no_limits  # noqa: F401  (a fixture)
from timeouts import registry
from timeouts.dispatch.claiming import claim_due
from timeouts.models import TimeoutTask
from timeouts.worker import running

Status = TimeoutTask.Status
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60), pytest.mark.usefixtures("no_limits")]
TASKS_URL = "/admin/timeouts/timeouttask/"


@pytest.fixture
def late_handler():
    timeouts.handler("test.late", max_lateness=timedelta(minutes=5), on_late="skip")(lambda task: None)
    yield "test.late"
    registry.unregister("test.late")


def log():
    return list(LogEntry.objects.order_by("pk").values_list("object_repr", "change_message", "action_flag"))


def test_the_page_shows_the_policy_in_force_and_the_handlers(viewer, late_handler):  # noqa: F811
    timeouts.set_limits("test.fail", max_lateness=timedelta(seconds=30), on_late="dead")
    rows = rows_by_biz_type(viewer.get(URL))
    assert rows["test.late"].policy_shown == {"max_lateness": "300 s", "on_late": "skip", "handler": "300 s, skip",
                                              "max_lateness_input": "300"}
    assert rows["test.fail"].policy.overridden and rows["test.fail"].overridden
    assert not rows["test.record"].overridden and rows["test.record"].policy.max_lateness is None
    html = viewer.get(URL).content.decode()
    assert "over 300 s: skip" in html and "over 30 s: dead" in html and "override; handler: none, run" in html
    assert 'value="set_lateness"' not in html  # a viewer has no forms


def test_set_and_reset_the_policy_from_the_page_each_logged(changer, late_handler):  # noqa: F811
    response = changer.post(URL, {"action": "set_lateness", "biz_type": late_handler, "max_lateness": "1.5",
                                  "on_late": "dead"}, follow=True)
    assert timeouts.limits(late_handler) == timeouts.Limits(None, None, False, timedelta(seconds=1.5), "dead")
    assert f"Biz type {late_handler}: set lateness policy: max_lateness 300 s -> 1.5 s, on_late skip -> dead." in [
        str(m) for m in response.context["messages"]]
    assert '<option value="dead" selected>' in response.content.decode()
    changer.post(URL, {"action": "set_lateness", "biz_type": late_handler, "max_lateness": "", "on_late": "run"})
    assert timeouts.limits(late_handler).max_lateness is None
    changer.post(URL, {"action": "reset_limits", "biz_type": late_handler})
    assert timeouts.limits(late_handler) == timeouts.Limits(None, None, False, timedelta(minutes=5), "skip")
    assert log() == [
        ("biz_type test.late", "set lateness policy: max_lateness 300 s -> 1.5 s, on_late skip -> dead", CHANGE),
        ("biz_type test.late", "set lateness policy: max_lateness 1.5 s -> none, on_late dead -> run", CHANGE),
        ("biz_type test.late", "limits reset to the handler's: rate_limit none -> none, concurrency none -> none, "
                               "max_lateness none -> 300 s, on_late run -> skip", CHANGE)]


@pytest.mark.parametrize("max_lateness, on_late, message", [
    ("soon", "skip", "max_lateness must be a positive number of seconds or blank (no limit), got 'soon'"),
    ("0", "skip", "max_lateness must be a positive number of seconds"),
    ("-5", "run", "max_lateness must be a positive number of seconds"),
    ("inf", "dead", "max_lateness must be a positive number of seconds"),
    ("nan", "dead", "max_lateness must be a positive number of seconds"),
    ("1e300", "dead", "max_lateness must be a positive number of seconds"),
    ("60", "drop", "on_late must be 'run', 'skip' or 'dead', got 'drop'"),
    ("", "skip", "on_late='skip' needs a max_lateness"),
])
def test_bad_input_changes_nothing_and_says_why(changer, max_lateness, on_late, message):  # noqa: F811
    before = timeouts.limits("test.fail")
    response = changer.post(URL, {"action": "set_lateness", "biz_type": "test.fail", "max_lateness": max_lateness,
                                  "on_late": on_late}, follow=True)
    [shown] = response.context["messages"]
    assert shown.level_tag == "error" and str(shown).startswith(f"Nothing was changed: {message}")
    assert timeouts.limits("test.fail") == before
    assert not LogEntry.objects.exists()


def test_a_viewer_cannot_set_a_policy(viewer):  # noqa: F811
    response = viewer.post(URL, {"action": "set_lateness", "biz_type": "test.record", "max_lateness": "5",
                                 "on_late": "skip"})
    assert response.status_code == 403
    assert timeouts.limits("test.record").max_lateness is None


def test_the_ended_late_filter_lists_the_tasks_a_late_start_ended(admin_client, starts):
    def due(biz_id, ago):
        return TimeoutTask.objects.schedule("test.record", biz_id, at=datetime.now(UTC) - timedelta(seconds=ago))

    timeouts.set_limits("test.record", max_lateness=timedelta(seconds=10), on_late="skip")
    skipped, ran = due("skipped", 60), due("ran", 1)
    cancelled = due("cancelled", 60)
    assert cancelled.cancel() is True
    for claim in claim_due(10):
        running.run(claim.fence)
    timeouts.set_limits("test.record", max_lateness=timedelta(seconds=10), on_late="dead")
    dead, requeued = due("dead", 60), due("requeued", 60)
    for claim in claim_due(10):
        running.run(claim.fence)
    assert TimeoutTask.objects.get(job_id=requeued.job_id).requeue() is True  # PENDING again: not listed

    def listed(value):
        response = admin_client.get(TASKS_URL, {"late": value})
        assert response.status_code == 200
        return {task.job_id for task in response.context["cl"].result_list}

    assert listed("skip") == {skipped.job_id}
    assert listed("dead") == {dead.job_id}
    assert listed("sometimes") == set()
    assert TimeoutTask.objects.get(job_id=ran.job_id).status == Status.DONE
