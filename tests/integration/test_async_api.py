"""The async face (aschedule, abulk_schedule, acancel, areschedule, arequeue), called by an async
view through Django's async request path against the real database: the same results and the
same typed errors as the sync functions."""

import json

import pytest
from asgiref.sync import async_to_sync
from asgiref.testing import ApplicationCommunicator
from django.core.asgi import get_asgi_application
from django.db import connections
from django.test import AsyncClient

import timeouts
from timeouts.models import TimeoutTask

Status = TimeoutTask.Status
URLS = "tests.testapp.async_views"
# transaction=True: a request's sync parts may run on a thread of their own, with its own
# connection, which would not see the rows of a test's transaction.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.urls(URLS), pytest.mark.timeout(60)]


def call(name, *args, **kwargs):
    """(status code, JSON body) of the view's answer to timeouts/<name>."""
    response = async_to_sync(AsyncClient().post)(f"/timeouts/{name}", {"args": args, "kwargs": kwargs},
                                                 content_type="application/json")
    return response.status_code, response.json()


def test_every_async_function_answers_as_its_sync_twin():
    status, body = call("schedule", "test.record", "k", delay=60, attribute={"reason": "unpaid"})
    assert status == 200 and body["result"]["status"] == Status.PENDING and body["result"]["biz_id"] == "k"
    task = TimeoutTask.objects.get(job_id=body["result"]["job_id"])
    assert task.attribute == {"reason": "unpaid"} and task.status == Status.PENDING
    assert call("reschedule", "test.record", "k", delay=3600) == (200, {"result": True})
    assert call("cancel", "test.record", "k") == (200, {"result": True})
    assert call("cancel", "test.record", "k") == (200, {"result": False})
    assert call("requeue", "test.record", "k") == (200, {"result": True})
    assert call("bulk_schedule", [{"biz_type": "test.record", "biz_id": i, "delay": 60} for i in range(3)]) \
        == (200, {"result": 3})
    assert TimeoutTask.objects.filter(status=Status.PENDING).count() == 4


@pytest.mark.parametrize("name, args, kwargs, error", [
    ("schedule", ["test.record", "k"], {}, "InvalidTime"),
    ("schedule", ["test.record", "k"], {"delay": 5, "attribute": {"x": "a\x00b"}}, "InvalidAttribute"),
    ("schedule", ["no.such.handler", "k"], {"delay": 5}, "UnknownBizType"),
    ("bulk_schedule", [[{"biz_type": "test.record", "biz_id": 1, "delay": 5}, {"biz_type": "test.record"}]], {},
     "TimeoutsError"),
    ("cancel", ["test.recrod", "k"], {}, "UnknownBizType"),
    ("reschedule", ["test.record", "k"], {"delay": "soon"}, "InvalidTime"),
    ("requeue", ["test.record", ""], {}, "InvalidBizId"),
])
def test_typed_errors_come_through_and_nothing_is_stored(name, args, kwargs, error):
    status, body = call(name, *args, **kwargs)
    assert (status, body["error"]) == (400, error), body
    assert body["message"]
    assert TimeoutTask.objects.count() == 0


def test_a_conflict_comes_through_as_task_conflict():
    first = timeouts.schedule("test.record", "k", delay=60)
    status, body = call("schedule", "test.record", "k", delay=5)
    assert (status, body["error"]) == (400, "TaskConflict") and str(first.job_id) in body["message"]
    assert list(TimeoutTask.objects.values_list("job_id", flat=True)) == [first.job_id]


def test_an_unknown_keyword_names_the_async_function():
    with pytest.raises(TypeError, match=r"^aschedule\(\) got an unexpected keyword argument 'when'$"):
        timeouts.aschedule("test.record", "k", when=5)


def test_the_view_answers_through_django_s_asgi_application(monkeypatch):
    """Through Django's ASGI handler, as a server runs it: there the request's sync parts
    (aschedule()'s body among them) run on a thread of the request's own, with its connection."""
    # Django's advice under ASGI: no persistent connections. The request's thread then closes its
    # connection when the request ends, rather than leave it open after the thread is gone.
    monkeypatch.setitem(connections.settings["default"], "CONN_MAX_AGE", 0)
    body = json.dumps({"args": ["test.record", "asgi"], "kwargs": {"delay": 60}}).encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/timeouts/schedule", "raw_path": b"/timeouts/schedule", "query_string": b"", "root_path": "",
             "headers": [(b"host", b"testserver"), (b"content-type", b"application/json")],
             "client": ("127.0.0.1", 1), "server": ("testserver", 80)}

    async def request():
        communicator = ApplicationCommunicator(get_asgi_application(), scope)
        await communicator.send_input({"type": "http.request", "body": body, "more_body": False})
        start = await communicator.receive_output(30)
        content = await communicator.receive_output(30)
        await communicator.send_input({"type": "http.disconnect"})
        await communicator.wait(30)
        return start["status"], json.loads(content["body"])

    status, answer = async_to_sync(request)()
    assert status == 200, answer
    assert TimeoutTask.objects.get(job_id=answer["result"]["job_id"]).biz_id == "asgi"
