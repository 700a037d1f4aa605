"""timeouts.celery.DurableTask as a Celery app's task class, and what it decides without a database:
which calls it stores (not yet due, not Celery's own) and the biz_type of a task name."""

from datetime import UTC, datetime, timedelta

from celery import Celery

from timeouts.celery import DurableTask
from timeouts.durable.calls import biz_type_for
from timeouts.durable.task import _not_yet_due
from timeouts.registry import BIZ_TYPE_RE


def new_app():
    return Celery("host", broker="memory://", task_cls="timeouts.celery:DurableTask", set_as_current=False)


def test_task_cls_makes_every_task_of_the_app_durable():
    app = new_app()

    @app.task(name="host.charge")
    def charge(order_id):
        return order_id

    assert isinstance(app.tasks["host.charge"], DurableTask)
    assert isinstance(app.tasks["celery.chord_unlock"], DurableTask)  # and left to Celery's ways


def test_a_call_is_stored_only_while_its_eta_is_to_come():
    app = new_app()
    now = datetime.now(UTC)
    assert _not_yet_due(app, None, None) is None
    assert _not_yet_due(app, None, 0) is None
    assert _not_yet_due(app, None, -5) is None
    assert _not_yet_due(app, now - timedelta(seconds=1), None) is None
    assert now + timedelta(seconds=29) < _not_yet_due(app, None, 30) <= datetime.now(UTC) + timedelta(seconds=30)
    assert _not_yet_due(app, (now + timedelta(minutes=1)).isoformat(), None) == now + timedelta(minutes=1)
    # a countdown wins over an eta, as in Celery
    assert _not_yet_due(app, now + timedelta(hours=1), 10) < now + timedelta(minutes=1)
    # a naive eta is in the app's time zone (UTC by default)
    assert _not_yet_due(app, (now + timedelta(minutes=1)).replace(tzinfo=None), None) == now + timedelta(minutes=1)


def test_a_task_name_that_is_no_biz_type_is_cut_and_told_apart():
    long_a, long_b = "x." * 40 + "a", "x." * 40 + "b"
    for name in (long_a, long_b, "tâche spéciale"):
        assert BIZ_TYPE_RE.fullmatch(biz_type_for(name))
    assert biz_type_for(long_a) != biz_type_for(long_b)
    assert biz_type_for("shop.tasks.charge") == "celery:shop.tasks.charge"
