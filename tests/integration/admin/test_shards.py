"""The TimeoutTask admin on three shards (three test databases): the "all shards" page merges every
shard's newest tasks, the shard filter shows one shard, search, the detail page and the actions find
each task on its shard, and a shard that is down leaves the others' tasks listed with a message."""

import itertools
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission, User
from django.db import connections
from django.test.utils import CaptureQueriesContext

import timeouts
from tests.support.shards import ALIASES, three_shards, unreachable  # noqa: F401 (an autouse fixture)
from timeouts import stats
from timeouts.admin import TimeoutTaskAdmin
from timeouts.admin.paginator import EstimatedCountPaginator
from timeouts.models import TimeoutTask
from timeouts.storage import shards

Status = TimeoutTask.Status
URL = "/admin/timeouts/timeouttask/"
pytestmark = [pytest.mark.django_db(transaction=True, databases=ALIASES), pytest.mark.timeout(120)]


@pytest.fixture
def as_user(client):
    viewer = User.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_timeouttask"))
    accounts = {"viewer": viewer, "superuser": User.objects.create_superuser("root", "root@example.com", "pw")}

    def login(name):
        client.force_login(accounts[name])
        return client
    return login


_keys = itertools.count()


def on(alias, *, hours=2, at=None, prefix="key"):
    """A PENDING task on `alias` (its biz_id starts with `prefix`), due in `hours` or `at`."""
    keys = (f"{prefix}-{n}" for n in _keys)
    biz_id = next(key for key in keys if shards.place("test.record", key).alias == alias)
    at = at or datetime.now(UTC) + timedelta(hours=hours)
    task = timeouts.schedule("test.record", biz_id, at=at)
    assert task._state.db == alias
    return task


def row(task):
    """The task as its shard has it now."""
    return TimeoutTask.objects.using(shards.alias_of_job(task.job_id)).get(job_id=task.job_id)


def job_ids(response):
    assert response.status_code == 200
    return [task.job_id for task in response.context["cl"].result_list]


def messages_of(response):
    return [str(m) for m in response.context["messages"]]


def newest_first(tasks):
    return [task.job_id for task in sorted(tasks, key=lambda t: (t.action_time, t.job_id), reverse=True)]


def post_action(client, action, tasks, **extra):
    data = {"action": action, "index": 0, "_selected_action": [t.job_id for t in tasks], **extra}
    return client.post(URL, data, follow=True)


def test_the_all_shards_page_merges_the_newest_tasks_of_every_shard_in_order(as_user, monkeypatch):
    monkeypatch.setattr(TimeoutTaskAdmin, "list_per_page", 4)
    tasks = [on(alias, hours=hours) for hours, alias in zip(range(1, 9), itertools.cycle(ALIASES))]
    tasks.append(on("shard_c", at=tasks[-1].action_time))  # a tie with shard_b's newest: job_id decides
    client = as_user("viewer")
    expected = newest_first(tasks)
    pages = [job_ids(client.get(URL, {"p": p})) for p in (1, 2, 3)]
    assert pages == [expected[:4], expected[4:8], expected[8:]]
    assert job_ids(as_user("superuser").get(URL, {"o": "5"})) == expected[::-1][:4]  # oldest first


def test_each_shard_reads_only_the_rows_up_to_the_end_of_the_page(as_user, monkeypatch):
    monkeypatch.setattr(TimeoutTaskAdmin, "list_per_page", 2)
    for hours, alias in zip(range(1, 10), itertools.cycle(ALIASES)):
        on(alias, hours=hours)
    client = as_user("viewer")
    captured = {alias: CaptureQueriesContext(connections[alias]) for alias in ALIASES}
    with captured["default"], captured["shard_b"], captured["shard_c"]:
        assert len(job_ids(client.get(URL, {"p": 2}))) == 2
    for queries in captured.values():
        [page] = [q["sql"] for q in queries.captured_queries if "ORDER BY" in q["sql"] and "timeouts_task" in q["sql"]]
        assert page.endswith("LIMIT 4"), page


def test_the_count_is_the_sum_of_each_shards_count(as_user, monkeypatch):
    for alias in ALIASES:
        for _ in range(3):
            on(alias)
    client = as_user("viewer")
    cl = client.get(URL).context["cl"]
    assert (cl.result_count, cl.paginator.count_is_exact, cl.multi_page) == (9, True, False)
    monkeypatch.setattr(EstimatedCountPaginator, "exact_limit", 2)  # each shard's 3 tasks: estimated
    response = client.get(URL)
    cl = response.context["cl"]
    each = [stats.count(TimeoutTask.objects.using(alias), exact_limit=2) for alias in ALIASES]
    assert not any(count.exact for count in each) and not cl.paginator.count_is_exact
    assert cl.paginator.counted.value == sum(count.value for count in each) >= 9
    assert "The count is an estimate" in response.content.decode()


def test_the_shard_filter_shows_one_shard(as_user):
    mine = {alias: [on(alias), on(alias, hours=3)] for alias in ALIASES}
    client = as_user("viewer")
    response = client.get(URL, {"shard": "shard_b"})
    assert job_ids(response) == newest_first(mine["shard_b"])
    cl = response.context["cl"]
    assert cl.queryset.db == "shard_b" and cl.result_count == 2
    [shard_filter] = [spec for spec in cl.filter_specs if spec.parameter_name == "shard"]
    assert [choice["display"] for choice in shard_filter.choices(cl)] == ["all shards", *ALIASES]
    assert job_ids(client.get(URL, {"shard": "no_such_shard"})) == []
    assert job_ids(client.get(URL)) == newest_first([task for tasks in mine.values() for task in tasks])


def test_one_shard_has_no_shard_filter(as_user, settings):
    settings.TIMEOUTS = {**settings.TIMEOUTS, "SHARDS": ["default"]}
    task = on("default")
    cl = as_user("viewer").get(URL).context["cl"]
    assert "shard" not in [spec.parameter_name for spec in cl.filter_specs]
    assert [t.job_id for t in cl.result_list] == [task.job_id]


def test_search_by_job_id_finds_a_task_on_shard_c(as_user):
    task, other = on("shard_c"), on("shard_b")
    client = as_user("viewer")
    assert job_ids(client.get(URL, {"q": str(task.job_id)})) == [task.job_id]
    assert job_ids(client.get(URL, {"q": str(other.job_id), "shard": "shard_c"})) == []  # the filter holds


def test_search_by_biz_id_finds_it_on_any_shard(as_user):
    tasks = [on(alias) for alias in ALIASES]
    # A task placed off its hash's shard, as a SHARD_ROUTER may place it: found all the same.
    elsewhere = TimeoutTask.objects.db_manager("shard_c").schedule("test.record", tasks[1].biz_id, delay=60)
    client = as_user("viewer")
    assert job_ids(client.get(URL, {"q": tasks[0].biz_id})) == [tasks[0].job_id]
    assert job_ids(client.get(URL, {"q": f" {tasks[1].biz_id} "})) == newest_first([tasks[1], elsewhere])


def test_the_detail_page_of_a_task_on_shard_b_opens(as_user):
    task = on("shard_b", prefix="order-on-b")
    client = as_user("viewer")
    page = client.get(f"{URL}{task.job_id}/change/")
    assert page.status_code == 200 and task.biz_id in page.content.decode()
    assert page.context["original"].job_id == task.job_id
    assert client.get(f"{URL}{task.job_id}/history/").status_code == 200
    missing = client.get(f"{URL}{task.job_id + shards.SLOTS}/change/", follow=True)  # same shard, no task
    assert "doesn’t exist" in messages_of(missing)[0]


def test_cancel_and_requeue_change_the_tasks_on_their_shards_and_are_logged(as_user):
    chosen = [on("shard_b"), on("shard_c")]
    untouched = [on(alias) for alias in ALIASES]
    client = as_user("superuser")
    response = post_action(client, "cancel_selected", chosen)
    assert messages_of(response) == ["Cancelled 2 tasks."]
    assert [row(task).status for task in chosen] == [Status.CANCELLED, Status.CANCELLED]
    assert {row(task).status for task in untouched} == {Status.PENDING}
    response = post_action(client, "requeue_selected", chosen)
    assert messages_of(response) == ["Requeued 2 tasks (pending, due now)."]
    for task in chosen:
        after = row(task)
        assert after.status == Status.PENDING and after.action_time < task.action_time - timedelta(hours=1)
    logged = {(int(entry.object_id), entry.change_message) for entry in LogEntry.objects.using("default")}
    assert logged == {(task.job_id, message) for task in chosen for message in (
        "Cancelled (action: cancel_selected)", "Requeued: pending, due now, attempts reset (action: requeue_selected)")}
    assert not LogEntry.objects.using("shard_b").exists()


def test_run_now_and_select_all_act_on_every_shard(as_user):
    tasks = {alias: on(alias, hours=5) for alias in ALIASES}
    client = as_user("superuser")
    response = post_action(client, "run_now", [tasks["default"], tasks["shard_c"]])
    assert messages_of(response) == ["Made 2 tasks due now."]
    assert [row(task).action_time < task.action_time for task in tasks.values()] == [True, False, True]
    # "Select all" (every task the list matches, beyond the page) reaches every shard.
    response = post_action(client, "cancel_selected", [tasks["default"]], select_across=1)
    assert messages_of(response) == ["Cancelled 3 tasks."]
    assert {row(task).status for task in tasks.values()} == {Status.CANCELLED}


def test_a_shard_that_cannot_be_reached_leaves_the_page_working_with_a_message(as_user):
    tasks = {alias: on(alias) for alias in ALIASES}
    client = as_user("superuser")
    with unreachable("shard_b"):
        response = client.get(URL)
        assert job_ids(response) == newest_first([tasks["default"], tasks["shard_c"]])
        assert response.context["cl"].result_count == 2
        [message] = messages_of(response)
        assert "The shard 'shard_b' could not be read" in message
        assert message in response.content.decode().replace("&#x27;", "'")
        response = post_action(client, "cancel_selected", tasks.values())
        assert messages_of(response) == ["The shard 'shard_b' could not be read: its tasks were not changed.",
                                         "Cancelled 2 tasks.", message]
    assert [row(task).status for task in tasks.values()] == [Status.CANCELLED, Status.PENDING, Status.CANCELLED]
    assert len(job_ids(client.get(URL))) == 3  # back


def test_the_businesses_page_shows_one_shard_at_a_time(as_user):
    overdue = datetime.now(UTC) - timedelta(minutes=5)
    on("shard_b", at=overdue), on("shard_b", at=overdue), on("default", at=overdue)
    client = as_user("viewer")
    url = "/admin/timeouts/timeouttask/businesses/"
    first, second = client.get(url), client.get(url, {"shard": "shard_b"})
    assert [str(r.overdue) for r in first.context["rows"] if r.biz_type == "test.record"] == ["1"]
    assert [str(r.overdue) for r in second.context["rows"] if r.biz_type == "test.record"] == ["2"]
    assert (first.context["shard"], second.context["shard"]) == ("default", "shard_b")
    assert '<a href="?shard=shard_c">shard_c</a>' in second.content.decode()
