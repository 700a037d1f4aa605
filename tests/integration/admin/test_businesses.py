"""The businesses page: which biz_types it lists, the numbers and charts per biz_type, who may see
it and who may change limits from it, each change in the admin log. Query plans on a partitioned
table: test_admin_businesses_plans.py; the browser: tests/system/test_admin_businesses_browser.py."""

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Permission, User

import timeouts
from tests.support.factories import make_task
from timeouts import registry, stats
from timeouts.conf import notify_params
from timeouts.models import TimeoutTask
from timeouts.store import clock
from timeouts.store.queries import fetch_one

Status = TimeoutTask.Status
URL = "/admin/timeouts/timeouttask/businesses/"
pytestmark = [pytest.mark.django_db, pytest.mark.timeout(60)]


def now():
    return datetime.now(UTC)


def staff(username, *codenames):
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="timeouts", codename__in=codenames))
    return User.objects.get(pk=user.pk)  # without the permission cache


@pytest.fixture
def viewer(client):
    client.force_login(staff("viewer", "view_timeouttask"))
    return client


@pytest.fixture
def changer(client):
    client.force_login(staff("changer", "view_timeouttask", "change_limits"))
    return client


def schedule_without_handler(biz_type, biz_ids, **when):
    """Tasks of a biz_type whose handler this process no longer has (removed from the code)."""
    registry.handler(biz_type)(schedule_without_handler)
    try:
        TimeoutTask.objects.bulk_schedule([{"biz_type": biz_type, "biz_id": i, **when} for i in biz_ids])
    finally:
        registry.unregister(biz_type)


def rows_by_biz_type(response):
    assert response.status_code == 200
    return {row.biz_type: row for row in response.context["rows"]}


# --- Which biz_types ----------------------------------------------------------------------------

def test_lists_handlers_durable_tasks_and_biz_types_with_tasks(viewer):
    registry.note_of_kind("celery:tests.page.listed")
    schedule_without_handler("gone.handler", ["1"], delay=600)
    rows = rows_by_biz_type(viewer.get(URL))
    assert set(registry.registered()) <= set(rows)
    assert "handler" in rows["test.record"].sources
    assert rows["celery:tests.page.listed"].sources == ("DurableTask",)
    assert rows["gone.handler"].sources == ("waiting",)
    assert list(rows) == sorted(rows)


def test_waiting_biz_types_finds_each_once_however_many_tasks_wait():
    for biz_type in ("b.two", "a.one", "c.three", "d.cancelled"):
        schedule_without_handler(biz_type, range(50), delay=600)
    TimeoutTask.objects.filter(biz_type="d.cancelled").update(status=Status.CANCELLED, finished_at=now())
    assert stats.waiting_biz_types() == ["a.one", "b.two", "c.three"]
    assert stats.waiting_biz_types(limit=2) == ["a.one", "b.two"]


# --- The numbers --------------------------------------------------------------------------------

def test_overdue_counts_per_biz_type_exact_up_to_the_limit_then_estimated():
    for i in range(3):
        TimeoutTask.objects.schedule("test.record", i, at=now() - timedelta(minutes=1 + i))
    TimeoutTask.objects.schedule("test.fail", "1", at=now() - timedelta(seconds=5))
    TimeoutTask.objects.schedule("test.fail", "2", delay=600)  # not due
    make_task(Status.CANCELLED, biz_type="test.fail", biz_id="3", at=now() - timedelta(minutes=1))
    db_now = clock.database_now()
    assert stats.overdue_by_biz_type(["test.record", "test.fail", "test.slow"], db_now) == {
        "test.record": stats.Count(3, True), "test.fail": stats.Count(1, True), "test.slow": stats.Count(0, True)}
    capped = stats.overdue_by_biz_type(["test.record"], db_now, limit=2)["test.record"]
    assert not capped.exact and capped.value >= 3  # never below what was counted


def test_due_soon_counts_pending_tasks_by_bucket_and_marks_what_it_did_not_read():
    """By run_at: a retry waiting for its next attempt counts when that falls in the hour."""
    db_now = clock.database_now()
    for minutes in (1, 2, 12, 59):
        TimeoutTask.objects.schedule("test.record", minutes, at=db_now + timedelta(minutes=minutes))
    make_task(Status.CANCELLED, biz_id="cancelled", at=db_now + timedelta(minutes=3))
    retry = make_task(Status.RUNNING, biz_id="retry", at=db_now - timedelta(minutes=5))
    assert fetch_one("fail_task", {"job_id": retry.job_id, "action_time": retry.action_time, "attempt": 1,
                                   "error": "503", "backoff": 27 * 60, **notify_params()})["status"] == Status.PENDING
    TimeoutTask.objects.schedule("test.record", "later", at=db_now + timedelta(minutes=61))
    TimeoutTask.objects.schedule("test.record", "overdue", at=db_now - timedelta(minutes=1))
    found = stats.due_soon(["test.record", "test.fail"], db_now)
    assert found["test.record"].values == [2, 0, 1, 0, 0, 1, 0, 0, 0, 0, 0, 1]
    assert found["test.record"].complete
    assert found["test.fail"].values == [0] * 12
    capped = stats.due_soon(["test.record"], db_now, limit=3)["test.record"]  # read up to the 12th minute
    assert capped.values == [2, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0]
    assert capped.unread == (2, 12) and not capped.complete


def test_recent_lateness_of_started_and_still_waiting_first_attempts():
    db_now = clock.database_now()
    make_task(Status.DONE, biz_id="done", at=db_now - timedelta(minutes=2, seconds=30), started_after=0.5)
    make_task(Status.RUNNING, biz_id="running", at=db_now - timedelta(minutes=2, seconds=20), started_after=1.5)
    make_task(Status.CANCELLED, biz_id="cancelled", at=db_now - timedelta(minutes=2, seconds=10))
    TimeoutTask.objects.schedule("test.record", "waiting", at=db_now - timedelta(seconds=30))
    TimeoutTask.objects.schedule("test.record", "old", at=db_now - timedelta(minutes=20))  # outside the window
    found = stats.recent_lateness(["test.record", "test.fail"], db_now)["test.record"]
    assert len(found.values) == 15 and found.complete
    p50, p99, tasks = found.values[12]  # 2-3 minutes ago
    assert tasks == 2 and p50 == pytest.approx(1.0) and p99 == pytest.approx(1.49)
    p50, p99, tasks = found.values[14]  # the last minute: still waiting, 30 s late so far
    assert tasks == 1 and p50 == pytest.approx(30, abs=0.1)
    assert [value for i, value in enumerate(found.values) if i not in (12, 14)] == [None] * 13
    capped = stats.recent_lateness(["test.record"], db_now, limit=1)["test.record"]
    assert capped.values[14][2] == 1 and capped.unread == (0, 15)  # even the last minute may hold more


def test_the_page_shows_counts_and_charts(viewer):
    db_now = clock.database_now()
    TimeoutTask.objects.schedule("test.record", "o", at=db_now - timedelta(minutes=1))
    TimeoutTask.objects.schedule("test.record", "s", at=db_now + timedelta(minutes=7))
    response = viewer.get(URL)
    row = rows_by_biz_type(response)["test.record"]
    assert row.overdue == stats.Count(1, True) and row.due_total == "1"
    html = response.content.decode()
    assert html.count("<svg class=\"timeouts-chart ") == 2 * len(response.context["rows"])
    assert "?biz_type=test.record&amp;due=overdue" in html
    assert "0 running" in html
    assert "<script" not in html.split('id="content-main"')[1]


# --- Who may see and change ---------------------------------------------------------------------

def test_the_page_needs_the_view_permission(client):
    assert client.get(URL).status_code == 302  # to the login page
    client.force_login(staff("nobody"))
    assert client.get(URL).status_code == 403


def test_a_viewer_sees_no_change_form_and_cannot_post_one(viewer):
    response = viewer.get(URL)
    assert not response.context["can_change"]
    assert 'name="action"' not in response.content.decode()
    assert viewer.post(URL, {"action": "pause", "biz_type": "test.record"}).status_code == 403
    assert not LogEntry.objects.exists()


def test_the_changelist_links_to_the_page(viewer):
    assert URL in viewer.get("/admin/timeouts/timeouttask/").content.decode()


@pytest.fixture
def limited_handler():
    """A handler that declares limits, registered for one test."""
    registry.handler("test.limited", rate_limit=5, concurrency=2)(limited_handler)
    yield "test.limited"
    registry.unregister("test.limited")


def log():
    return list(LogEntry.objects.order_by("pk").values_list("object_repr", "change_message", "action_flag"))


def test_the_page_shows_the_limits_in_force_as_timeouts_limits_does(viewer, limited_handler):
    timeouts.set_limits("test.fail", rate_limit=10, concurrency=None)
    timeouts.pause("test.slow")
    rows = rows_by_biz_type(viewer.get(URL))
    for biz_type in ("test.limited", "test.fail", "test.slow", "test.record"):
        shown, limits = rows[biz_type].limits, timeouts.limits(biz_type)
        assert (shown.rate_limit, shown.concurrency, shown.paused) == (limits.rate_limit, limits.concurrency,
                                                                        limits.paused)
    assert rows["test.limited"].shown["rate_limit"] == "5/s" and not rows["test.limited"].limits.overridden
    assert rows["test.fail"].limits.overridden and rows["test.fail"].limits.handler_rate_limit is None
    assert rows["test.slow"].limits.paused and "limits" in rows["test.slow"].sources
    html = viewer.get(URL).content.decode()
    assert "override; handler: none" in html and "timeouts-state-paused" in html


def test_pause_and_resume_from_the_page_are_logged(changer):
    response = changer.post(URL, {"action": "pause", "biz_type": "test.record"}, follow=True)
    assert timeouts.limits("test.record").paused
    assert rows_by_biz_type(response)["test.record"].limits.paused
    assert "Biz type test.record: paused." in [str(m) for m in response.context["messages"]]
    changer.post(URL, {"action": "pause", "biz_type": "test.record"})  # already paused: nothing to log
    changer.post(URL, {"action": "resume", "biz_type": "test.record"})
    assert not timeouts.limits("test.record").paused
    assert log() == [("biz_type test.record", "paused", CHANGE), ("biz_type test.record", "resumed", CHANGE)]


def test_set_and_reset_limits_from_the_page_blank_means_no_limit(changer, limited_handler):
    changer.post(URL, {"action": "set_limits", "biz_type": "test.limited", "rate_limit": "2.5", "concurrency": ""})
    assert timeouts.limits("test.limited") == timeouts.Limits(2.5, None, False)
    row = rows_by_biz_type(changer.get(URL))["test.limited"]
    assert row.limits.overridden and (row.limits.handler_rate_limit, row.limits.handler_concurrency) == (5, 2)
    changer.post(URL, {"action": "reset_limits", "biz_type": "test.limited"})
    assert timeouts.limits("test.limited") == timeouts.Limits(5, 2, False)
    assert [message for _, message, _ in log()] == [
        "set limits: rate_limit 5/s -> 2.5/s, concurrency 2 -> none",
        "limits reset to the handler's: rate_limit 2.5/s -> 5/s, concurrency none -> 2"]


def test_a_biz_type_without_a_handler_has_no_form(changer):
    schedule_without_handler("gone.handler", ["1"], delay=600)
    response = changer.get(URL)
    assert not rows_by_biz_type(response)["gone.handler"].changeable
    assert 'value="gone.handler"' not in response.content.decode()


@pytest.mark.parametrize("data", [
    {"action": "set_limits", "biz_type": "test.fail", "rate_limit": "fast", "concurrency": ""},
    {"action": "set_limits", "biz_type": "test.fail", "rate_limit": "", "concurrency": "2.5"},
    {"action": "set_limits", "biz_type": "test.fail", "rate_limit": "-1", "concurrency": ""},
    {"action": "set_limits", "biz_type": "test.fail", "rate_limit": "inf", "concurrency": ""},
    {"action": "set_limits", "biz_type": "test.fail", "rate_limit": "", "concurrency": "0"},
    {"action": "set_limits", "biz_type": "test.fail", "rate_limit": "1e-13", "concurrency": ""},
    {"action": "set_limits", "biz_type": "test.fail", "rate_limit": "1e7", "concurrency": ""},
    {"action": "set_limits", "biz_type": "test.fail", "rate_limit": "", "concurrency": "2147483648"},
    {"action": "pause", "biz_type": "no spaces allowed"},
    {"action": "pause", "biz_type": "gone.handler"},
    {"action": "explode", "biz_type": "test.fail"},
])
def test_bad_input_changes_nothing_and_says_why(changer, data):
    before = timeouts.limits("test.fail")
    response = changer.post(URL, data, follow=True)
    assert [m.level_tag for m in response.context["messages"]] == ["error"]
    assert timeouts.limits("test.fail") == before
    assert not LogEntry.objects.exists()
