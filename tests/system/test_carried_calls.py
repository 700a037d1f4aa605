"""Stored Celery calls claimed together travel in one message (durable/together.py): through a real
worker each still runs as a Celery task of its own, with its task_id, its signals, its task events,
its result and its links, whether claimed when due or ahead (then each at its own ETA)."""

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from celery.result import AsyncResult
from django.db import connection

from tests.support import processes
from tests.system.test_dispatcher import dispatcher_process
from tests.system.test_durable_task import calls, settled
from tests.testapp import tasks
from timeouts.dispatch.scan import scan
from timeouts.models import TimeoutTask

Status = TimeoutTask.Status
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


class Events:
    """The task events the worker sends, received in a thread of this process until stopped."""

    def __init__(self, app):
        self.app, self.seen, self.receiver = app, [], None
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._capture, daemon=True)

    def _capture(self):
        with self.app.connection_for_read() as conn:
            self.receiver = self.app.events.Receiver(conn, handlers={"*": self.seen.append})
            consuming = self.receiver.on_consume_ready

            def on_consume_ready(*args, **kwargs):
                consuming(*args, **kwargs)
                self.ready.set()

            self.receiver.on_consume_ready = on_consume_ready
            self.receiver.capture(limit=None, timeout=None, wakeup=False)

    def __enter__(self):
        self.thread.start()
        assert self.ready.wait(10), "the event receiver to consume"
        return self

    def __exit__(self, *exc):
        self.receiver.should_stop = True
        self.thread.join(10)

    def of(self, task_id):
        return [event["type"] for event in self.seen if event.get("uuid") == task_id]


def signals_of(task_id):
    with connection.cursor() as cursor:
        cursor.execute("SELECT signal, detail FROM timeouts_test_celery_signal WHERE task_id = %s", [task_id])
        return sorted(cursor.fetchall())


@pytest.mark.timeout(120)
@pytest.mark.parametrize("claimed", ["when due", "ahead"])
def test_calls_that_travel_together_each_run_as_a_celery_task_of_its_own(transactional_db, broker, runs, claimed):
    from celery.backends.redis import RedisBackend

    from project.celery import app

    with connection.cursor() as cursor:
        cursor.execute(tasks.SIGNALS_TABLE_SQL)
        cursor.execute("TRUNCATE timeouts_test_celery_signal")
    broker.flushdb()
    backend = RedisBackend(app=app, url=app.conf.broker_url)
    env = processes.django_env(DJANGO_SETTINGS_MODULE="tests.settings_observed")
    with Events(app) as events, processes.running_worker(env=env, name="worker-observed"):
        eta = datetime.now(UTC) + timedelta(seconds=2)
        added = [tasks.add.apply_async((i, 1), eta=eta) for i in range(6)]
        linked = tasks.add.apply_async((10, 1), eta=eta, link=tasks.record.si("callback"))
        failing = tasks.fail.apply_async(eta=eta, link_error=tasks.record.si("errback"))
        if claimed == "when due":
            time.sleep(max((eta - datetime.now(UTC)).total_seconds(), 0) + 0.2)
            scan()  # every call at once, already due: one message without an ETA
            processes.wait_for(lambda: settled() and len(runs.all("tests.durable.record")) == 2, 30,
                               message="every call and its link")
        else:
            with dispatcher_process("dispatcher", "--lead", "0.8"):
                processes.wait_for(lambda: settled() and len(runs.all("tests.durable.record")) == 2, 30,
                                   message="every call and its link")
        for n, result in enumerate(added):
            assert AsyncResult(result.id, backend=backend, app=app).get(timeout=10) == n + 1
        assert AsyncResult(linked.id, backend=backend, app=app).get(timeout=10) == 11
        time.sleep(1)  # the last events
    rows = {row.biz_id: row for row in calls()}
    ran = [r[0] for r in runs.all()]
    assert len(ran) == len(set(ran)) == 10
    assert sorted(r[2][0] for r in runs.all("tests.durable.record")) == ["callback", "errback"]
    for result in [*added, linked]:
        assert rows[result.id].status == Status.DONE
        assert signals_of(result.id) == [("postrun", None), ("prerun", None), ("received", "CarriedMessage"),
                                         ("success", None)]
        assert events.of(result.id) == ["task-received", "task-started", "task-succeeded"]
    assert rows[failing.id].status == Status.DEAD
    assert signals_of(failing.id) == [("failure", None), ("postrun", None), ("prerun", None),
                                      ("received", "CarriedMessage")]
    assert events.of(failing.id) == ["task-received", "task-started", "task-failed"]
    assert all(started_at >= rows[task_id].action_time for task_id, *_, started_at in runs.all()
               if task_id in rows)


@pytest.mark.timeout(60)
def test_an_item_the_worker_cannot_read_is_rejected_alone_and_the_message_acknowledged(worker, runs, broker):
    from project.celery import app
    from timeouts.protocol import CALLS, call_item

    amqp = app.amqp
    own = amqp.create_task_message("good-call", "tests.durable.record", ["good"], {})
    unknown = amqp.create_task_message("unknown-call", "tests.no_such_task", [], {})
    items = [["not", "an item"], call_item({"task": "tests.durable.record"}, {}, [[], {}, {}]),
             call_item(unknown.headers, unknown.properties, list(unknown.body)),
             call_item(own.headers, own.properties, list(own.body))]
    carrier = amqp.create_task_message("carrier", CALLS, [items], {}, argsrepr="[<4 calls>]", kwargsrepr="{}")
    with app.producer_or_acquire() as producer:
        amqp.send_task_message(producer, CALLS, carrier, serializer="json")
    processes.wait_for(lambda: runs.all(), 30, message="the call that can be read")
    assert [(r[0], r[2]) for r in runs.all()] == [("good-call", ["good"])]
    processes.wait_for(lambda: not broker.hlen("unacked"), 10, message="the message acknowledged")
    assert worker.poll() is None
