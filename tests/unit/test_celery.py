"""timeouts.celery.setup(app): what it applies, what it leaves to the host, and what the system
check timeouts.W005 then says."""

from celery import Celery

import timeouts.celery
from timeouts import checks
from timeouts.celery import BEAT_QUEUE, BEAT_TASKS


def new_app(broker="memory://", **conf):
    app = Celery("host", broker=broker, set_as_current=False)
    app.conf.update(conf)
    return app


def route_of(app, task_name):
    return app.amqp.router.route({}, task_name)["queue"].name


def w005(app):
    return [p.msg for p in checks._check_setup(app) if p.id == "timeouts.W005"]


def test_setup_applies_what_timeouts_relies_on_once_the_app_is_configured():
    app = new_app()
    timeouts.celery.setup(app)
    assert set(BEAT_TASKS) <= {entry["task"] for entry in app.conf.beat_schedule.values()}
    assert {route_of(app, name) for name in BEAT_TASKS} == {BEAT_QUEUE}
    assert route_of(app, "host.other") == "celery"
    assert {q.name for q in app.conf.task_queues} == {"celery", BEAT_QUEUE}  # a plain worker consumes both
    assert app.conf.worker_prefetch_multiplier == 1
    assert "json" in app.conf.accept_content
    assert w005(app) == []


def test_what_the_host_chose_wins_and_the_check_says_what_it_costs():
    app = new_app(worker_prefetch_multiplier=8, accept_content=["json", "pickle"],
                  beat_schedule={"timeouts.scan": {"task": "timeouts.scan", "schedule": 30.0}},
                  task_routes={"timeouts.scan": {"queue": "ops"}})
    timeouts.celery.setup(app)
    assert app.conf.worker_prefetch_multiplier == 8
    assert app.conf.beat_schedule["timeouts.scan"]["schedule"] == 30.0
    assert "timeouts.maintain" in app.conf.beat_schedule
    assert route_of(app, "timeouts.scan") == "ops" and route_of(app, "timeouts.maintain") == BEAT_QUEUE
    [message] = w005(app)
    assert "worker_prefetch_multiplier is 8" in message


def test_a_host_that_accepts_only_pickle_still_accepts_timeouts_json():
    app = new_app(accept_content=["pickle"])
    timeouts.celery.setup(app)
    assert list(app.conf.accept_content) == ["pickle", "json"]


def test_rabbitmq_gets_publisher_confirms_unless_the_host_set_them(monkeypatch):
    monkeypatch.delenv("CELERY_BROKER_URL")  # the tests' broker, which Celery would prefer
    app = new_app(broker="amqp://guest:guest@127.0.0.1:5672//")
    timeouts.celery.setup(app)
    assert app.conf.broker_transport_options["confirm_publish"] is True
    assert w005(app) == []
    app = new_app(broker="amqp://guest:guest@127.0.0.1:5672//", broker_transport_options={"confirm_publish": False})
    timeouts.celery.setup(app)
    assert app.conf.broker_transport_options["confirm_publish"] is False
    assert any("Publisher confirms are off" in message for message in w005(app))


def test_setup_of_an_app_already_configured_applies_at_once():
    app = new_app()
    assert app.conf.worker_prefetch_multiplier == 4  # reading the configuration configures the app
    timeouts.celery.setup(app)
    assert app.conf.worker_prefetch_multiplier == 1 and "timeouts.scan" in app.conf.beat_schedule


def test_beat_tasks_can_stay_on_the_default_queue():
    app = new_app()
    timeouts.celery.setup(app, beat_queue=None)
    assert app.conf.task_queues is None and route_of(app, "timeouts.scan") == "celery"
    assert "timeouts.scan" in app.conf.beat_schedule


def test_an_app_not_wired_by_setup_is_warned_about():
    app = new_app()
    app.conf.beat_schedule = timeouts.celery.beat_schedule()
    [message] = w005(app)
    assert "was not wired with timeouts.celery.setup(app)" in message
