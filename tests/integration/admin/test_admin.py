"""The TimeoutTask admin: columns, filters, search, the detail page, the estimated count, and the
actions with their permissions (view-only, cancel-only and superuser accounts), crafted POSTs
included. Query plans on partitioned data: test_admin_plans.py; the browser: test_admin_browser.py."""

from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Permission, User
from django.test import RequestFactory

from tests.support.factories import make_task
from timeouts.admin import TimeoutTaskAdmin, actions
from timeouts.admin.paginator import EstimatedCountPaginator
from timeouts.models import TimeoutTask

Status = TimeoutTask.Status
PENDING, DISPATCHED, DONE, CANCELLED, RUNNING, DEAD = (
    Status.PENDING, Status.DISPATCHED, Status.DONE, Status.CANCELLED, Status.RUNNING, Status.DEAD)
URL = "/admin/timeouts/timeouttask/"
pytestmark = [pytest.mark.django_db, pytest.mark.timeout(60)]

TRACEBACK = 'Traceback (most recent call last):\n  File "h.py", line 3, in close\nRuntimeError: upstream <503>'
# Started tasks began 250 ms after their action_time; a DEAD one 2 s after, and left a traceback.
STARTED = {RUNNING: {"started_after": 0.25}, DONE: {"started_after": 0.25},
           DEAD: {"started_after": 2, "last_error": TRACEBACK}}


def now():
    return datetime.now(UTC)


def make(status=PENDING, *, at=None, biz_type="test.record", biz_id="1", attribute=None):
    """A task in `status`; tasks that have started are due in the past."""
    return make_task(status, at=at, biz_type=biz_type, biz_id=biz_id, attribute=attribute, **STARTED.get(status, {}))


def reload(task):
    return TimeoutTask.objects.get(job_id=task.job_id)


def staff(username, *codenames):
    user = User.objects.create_user(username, password="pw", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(content_type__app_label="timeouts", codename__in=codenames))
    return user


@pytest.fixture
def accounts():
    return {
        "viewer": staff("viewer", "view_timeouttask"),
        "canceller": staff("canceller", "view_timeouttask", "cancel_timeouttask"),
        "superuser": User.objects.create_superuser("root", "root@example.com", "pw"),
    }


@pytest.fixture
def as_user(client, accounts):
    def login(name):
        client.force_login(accounts[name])
        return client
    return login


def post_action(client, action, tasks, **extra):
    data = {"action": action, "index": 0, "_selected_action": [t.job_id for t in tasks], **extra}
    return client.post(URL, data, follow=True)


def messages_of(response):
    return [str(m) for m in response.context["messages"]] if response.context else []


def job_ids(response):
    return [task.job_id for task in response.context["cl"].result_list]


# --- Permissions: each action x each account ------------------------------------------------------

ALLOWED = {  # action -> accounts that may run it
    "cancel_selected": {"canceller", "superuser"},
    "run_now": {"canceller", "superuser"},
    "requeue_selected": {"superuser"},
}
START_STATUS = {"cancel_selected": PENDING, "run_now": PENDING, "requeue_selected": DEAD}


@pytest.mark.parametrize("account", ["viewer", "canceller", "superuser"])
@pytest.mark.parametrize("action", sorted(ALLOWED))
def test_each_action_runs_only_for_accounts_with_its_permission(as_user, account, action):
    task = make(START_STATUS[action])
    response = post_action(as_user(account), action, [task])
    after = reload(task)
    logged = LogEntry.objects.filter(object_id=str(task.job_id))
    if account in ALLOWED[action]:
        assert response.status_code == 200
        expected = {"cancel_selected": CANCELLED, "run_now": PENDING, "requeue_selected": PENDING}[action]
        assert after.status == expected
        if action == "run_now":
            assert after.action_time < task.action_time - timedelta(hours=1)
        [entry] = logged
        assert entry.action_flag == CHANGE and entry.user.username == ("root" if account == "superuser" else account)
        assert f"(action: {action})" in entry.change_message
    else:
        assert response.status_code in (200, 403)
        assert (after.status, after.action_time, after.modified_at) == (task.status, task.action_time, task.modified_at)
        assert not logged.exists()
        # Django does not run (or offer) an action its user lacks the permission of: the canceller
        # is told "No action selected.", the viewer (offered no action at all) just sees the list.
        assert messages_of(response) in ([], ["No action selected."])


def test_actions_offered_match_permissions(as_user):
    offered = {}
    for account in ("viewer", "canceller", "superuser"):
        response = as_user(account).get(URL)
        assert response.status_code == 200
        form = response.context["action_form"]
        offered[account] = {name for name, _ in form.fields["action"].choices if name} if form else set()
    assert offered["viewer"] == set()
    assert offered["canceller"] == {"cancel_selected", "run_now"}
    assert offered["superuser"] == {"cancel_selected", "run_now", "requeue_selected"}


def test_view_only_staff_can_look_but_crafted_posts_change_nothing(as_user):
    task = make(PENDING, attribute={"reason": "unpaid"})
    client = as_user("viewer")
    assert client.get(URL).status_code == 200
    page = client.get(f"{URL}{task.job_id}/change/")
    assert page.status_code == 200 and b'name="_save"' not in page.content
    change = {"biz_type": "test.record", "biz_id": "2", "status": DONE, "attempts": 9, "_save": "Save"}
    assert client.post(f"{URL}{task.job_id}/change/", change).status_code == 403
    assert client.post(f"{URL}{task.job_id}/delete/", {"post": "yes"}).status_code == 403
    assert client.post(f"{URL}add/", change).status_code == 403
    assert client.get(f"{URL}add/").status_code == 403
    for action in ("delete_selected", "cancel_selected", "requeue_selected", "run_now"):
        post_action(client, action, [task])
        post_action(client, action, [task], select_across=1)
    # A list_editable-style save of the changelist.
    client.post(URL, {"_save": "Save", "form-TOTAL_FORMS": 1, "form-INITIAL_FORMS": 1, "form-0-job_id": task.job_id,
                      "form-0-status": CANCELLED})
    after = reload(task)
    assert (after.status, after.biz_id, after.attempts, after.modified_at) == (PENDING, "1", 0, task.modified_at)
    assert not LogEntry.objects.exists()


def test_nobody_adds_edits_or_deletes_by_default(as_user):
    task = make(DONE)
    client = as_user("superuser")
    assert client.get(f"{URL}add/").status_code == 403
    assert client.post(f"{URL}{task.job_id}/change/", {"biz_id": "9", "_save": "Save"}).status_code == 403
    assert client.post(f"{URL}{task.job_id}/delete/", {"post": "yes"}).status_code == 403
    post_action(client, "delete_selected", [task], post="yes")
    assert reload(task).biz_id == "1"


def test_calling_an_action_directly_checks_its_permission(accounts):
    request = RequestFactory().post(URL)
    request.user = accounts["viewer"]
    model_admin = TimeoutTaskAdmin(TimeoutTask, None)
    task = make(DEAD)
    for action in (actions.cancel_selected, actions.requeue_selected, actions.run_now):
        with pytest.raises(actions.PermissionDenied):
            action(model_admin, request, TimeoutTask.objects.filter(job_id=task.job_id))
    assert reload(task).status == DEAD


# --- What the actions do and say ---------------------------------------------------------------------

def test_cancel_says_how_many_were_cancelled_and_how_many_were_too_late(as_user):
    waiting = [make(PENDING, biz_id=i) for i in range(2)] + [make(DISPATCHED), make(DEAD)]
    late = [make(RUNNING), make(DONE), make(CANCELLED)]
    response = post_action(as_user("canceller"), "cancel_selected", waiting + late)
    assert messages_of(response) == [
        "Cancelled 4 tasks. 3 tasks too late to cancel (1 cancelled, 1 done, 1 running)."]
    assert {reload(t).status for t in waiting} == {CANCELLED}
    assert [reload(t).status for t in late] == [RUNNING, DONE, CANCELLED]
    entries = {int(e.object_id): e.change_message for e in LogEntry.objects.all()}
    assert len(entries) == 7
    assert entries[waiting[0].job_id] == "Cancelled (action: cancel_selected)"
    assert entries[late[0].job_id] == "Not cancelled: too late, the task is running (action: cancel_selected)"


def test_requeue_moves_dead_and_cancelled_tasks_to_pending_due_now(as_user):
    dead, cancelled, pending = make(DEAD), make(CANCELLED), make(PENDING)
    response = post_action(as_user("superuser"), "requeue_selected", [dead, cancelled, pending])
    assert messages_of(response) == [
        "Requeued 2 tasks (pending, due now). 1 task not requeued: not dead or cancelled (1 pending)."]
    for task in (dead, cancelled):
        after = reload(task)
        assert (after.status, after.attempts) == (PENDING, 0)
        assert abs(after.action_time - now()) < timedelta(minutes=1)
    assert reload(pending).action_time == pending.action_time


def test_run_now_moves_future_pending_tasks_only(as_user):
    future = make(PENDING, at=now() + timedelta(days=3))
    overdue = make(PENDING, at=now() - timedelta(minutes=1))
    done = make(DONE)
    response = post_action(as_user("canceller"), "run_now", [future, overdue, done])
    assert messages_of(response) == [
        "Made 1 task due now. 1 task already due. 1 task too late: no longer pending (1 done)."]
    moved = reload(future)
    assert moved.status == PENDING and moved.run_at == moved.action_time
    assert abs(moved.action_time - now()) < timedelta(minutes=1)
    assert TimeoutTask.objects.due().filter(job_id=future.job_id).exists()
    assert reload(overdue).action_time == overdue.action_time  # its lateness stays true


def test_an_action_refuses_more_tasks_than_its_limit(as_user, monkeypatch):
    monkeypatch.setattr(actions, "MAX_TASKS", 2)
    tasks = [make(PENDING, biz_id=i) for i in range(3)]
    response = post_action(as_user("superuser"), "cancel_selected", tasks)
    assert "Nothing was changed: an action works on at most 2 tasks at once" in messages_of(response)[0]
    assert {reload(t).status for t in tasks} == {PENDING}
    response = post_action(as_user("superuser"), "cancel_selected", tasks[:1], select_across=1)
    assert "Nothing was changed" in messages_of(response)[0]


# --- The changelist --------------------------------------------------------------------------------

def test_changelist_columns_and_coloured_status(as_user):
    make(DEAD, biz_id="order-7")
    response = as_user("superuser").get(URL)
    headers = [h["text"] for h in response.context["result_headers"]]
    assert headers[1:] == ["job id", "biz type", "biz id", "status", "action time", "lateness", "attempts"]
    html = response.content.decode()
    assert 'class="timeouts-status timeouts-status-dead" style="background:#b91c1c' in html
    assert "order-7" in html and "2.00 s" in html  # lateness: started_at - action_time


def test_only_action_time_is_sortable_and_the_default_is_newest_first(as_user):
    older, newer = make(PENDING, at=now() + timedelta(hours=1)), make(PENDING, at=now() + timedelta(hours=2))
    client = as_user("superuser")
    assert job_ids(client.get(URL)) == [newer.job_id, older.job_id]
    assert job_ids(client.get(URL, {"o": "5"})) == [older.job_id, newer.job_id]
    sortable = [h["sortable"] for h in client.get(URL).context["result_headers"]]
    assert sortable == [False, False, False, False, False, True, False, False]


@pytest.mark.parametrize(("params", "expected"), [
    ({"status": f"{PENDING:d}"}, {"pending", "overdue", "fail"}),
    ({"status": f"{DISPATCHED:d}"}, {"dispatched"}),
    ({"status": f"{RUNNING:d}"}, {"running"}),
    ({"status": f"{DONE:d}"}, {"done"}),
    ({"status": f"{CANCELLED:d}"}, {"cancelled", "soon"}),
    ({"status": f"{DEAD:d}"}, {"dead"}),
    ({"status": "x"}, set()),
    ({"biz_type": "test.fail"}, {"fail"}),
    ({"biz_type": "no.such.type"}, set()),
    ({"due": "overdue"}, {"overdue"}),
    ({"due": "next_hour"}, {"soon"}),
    ({"due": "today"}, "today"),
    ({"status": f"{DEAD:d}", "biz_type": "test.record"}, {"dead"}),
])
def test_filters(as_user, params, expected):
    tasks = {
        "pending": make(PENDING, at=now() + timedelta(days=2)),
        "overdue": make(PENDING, at=now() - timedelta(minutes=3)),
        "soon": make(CANCELLED, at=now() + timedelta(minutes=30)),
        "dispatched": make(DISPATCHED, at=now() - timedelta(seconds=1)),
        "running": make(RUNNING), "done": make(DONE), "dead": make(DEAD),
        "cancelled": make(CANCELLED, at=now() - timedelta(days=2)),
        "fail": make(PENDING, biz_type="test.fail", at=now() + timedelta(days=3)),
    }
    from timeouts.admin.filters import today_bounds

    if expected == "today":
        start, end = today_bounds()
        expected = {name for name, task in tasks.items() if start <= task.action_time < end}
    names = {task.job_id: name for name, task in tasks.items()}
    response = as_user("superuser").get(URL, params)
    assert response.status_code == 200
    assert {names[job_id] for job_id in job_ids(response)} == expected


def test_biz_type_filter_offers_registered_handlers_without_querying_the_table(as_user):
    response = as_user("superuser").get(URL, {"biz_type": "gone.handler"})
    [biz_filter] = [f for f in response.context["cl"].filter_specs if f.parameter_name == "biz_type"]
    offered = [value for value, _ in biz_filter.lookup_choices]
    assert {"test.record", "test.fail", "gone.handler"} <= set(offered) and offered == sorted(offered)


def test_search_by_exact_job_id_or_biz_id(as_user):
    a, b = make(PENDING, biz_id="A-1"), make(PENDING, biz_id=str(10**6))
    client = as_user("superuser")
    assert job_ids(client.get(URL, {"q": str(a.job_id)})) == [a.job_id]
    assert job_ids(client.get(URL, {"q": " A-1 "})) == [a.job_id]
    assert job_ids(client.get(URL, {"q": "A-"})) == []
    assert job_ids(client.get(URL, {"q": str(10**6)})) == [b.job_id]
    assert job_ids(client.get(URL, {"q": "9" * 30})) == []


def test_detail_page_shows_json_history_and_lateness(as_user):
    task = make(DEAD, attribute={"reason": "unpaid", "lines": [1, 2], "nested": {"é": None}})
    html = as_user("viewer").get(f"{URL}{task.job_id}/change/").content.decode()
    assert '<pre class="timeouts-json"' in html
    assert '{\n  &quot;lines&quot;: [\n    1,\n    2\n  ],' in html and "&quot;é&quot;: null" in html
    assert 'class="timeouts-traceback"' in html and "RuntimeError: upstream &lt;503&gt;" in html
    assert "16 of 16" in html and "2.00 s" in html
    for label in ("Created at", "Dispatched at", "Started at", "Finished at", "Lease until"):
        assert label in html


def test_lateness_of_a_task_still_waiting(as_user):
    make(PENDING, at=now() - timedelta(minutes=3))
    html = as_user("superuser").get(URL).content.decode()
    assert '<span class="timeouts-overdue" style="color:#b91c1c">waiting 3 min' in html


# --- The estimated count ------------------------------------------------------------------------------

def test_small_results_are_counted_exactly_and_shown_on_one_page(as_user):
    for i in range(3):
        make(PENDING, biz_id=i)
    cl = as_user("superuser").get(URL).context["cl"]
    assert (cl.result_count, cl.paginator.count_is_exact, cl.multi_page) == (3, True, False)
    assert cl.full_result_count is None


def test_large_results_are_estimated_and_pages_are_capped(as_user, monkeypatch):
    monkeypatch.setattr(EstimatedCountPaginator, "exact_limit", 5)
    monkeypatch.setattr(EstimatedCountPaginator, "max_pages", 2)
    monkeypatch.setattr(TimeoutTaskAdmin, "list_per_page", 2)
    TimeoutTask.objects.bulk_schedule([{"biz_type": "test.record", "biz_id": i, "delay": 3600} for i in range(9)])
    client = as_user("superuser")
    response = client.get(URL)
    cl = response.context["cl"]
    assert not cl.paginator.count_is_exact and cl.result_count >= 6 and cl.multi_page
    assert cl.paginator.num_pages == 2 and cl.paginator.pages_capped
    html = response.content.decode()
    assert "The count is an estimate" in html and "Only the first 2 pages are offered" in html
    assert len(job_ids(client.get(URL, {"p": "2"}))) == 2
    assert client.get(URL, {"p": "3"}).url == f"{URL}?e=1"  # beyond the cap: Django's "invalid page"
