"""System checks: PostgreSQL, USE_TZ, the TIMEOUTS setting, the beat entries and handler queues."""

import io
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from django.test import override_settings
from kombu import Queue

from project.celery import app
from timeouts import checks, registry

pytestmark = pytest.mark.timeout(30)


def ids(problems):
    return [problem.id for problem in problems]


def test_the_project_passes_every_check():
    out = io.StringIO()
    call_command("check", stdout=out)
    assert "no issues" in out.getvalue()
    every = checks.check_database() + checks.check_time_zone() + checks.check_settings() + checks.check_celery()
    assert ids(every) == []


def test_postgresql_is_required(monkeypatch):
    monkeypatch.setattr(checks, "connections", {"default": SimpleNamespace(vendor="sqlite")})
    [problem] = checks.check_database()
    assert problem.id == "timeouts.E001" and "is sqlite" in problem.msg


@override_settings(USE_TZ=False)
def test_use_tz_is_required():
    [problem] = checks.check_time_zone()
    assert problem.id == "timeouts.E002" and "USE_TZ" in problem.msg


@pytest.mark.parametrize(("given", "message"), [
    ({"SCAN_INTERVAL": "5"}, "SCAN_INTERVAL must be a number, got '5'"),
    ({"PARTITIONS_AHEAD": 0}, "PARTITIONS_AHEAD must be >= 1, got 0"),
    ({"DEFAULT_TTR": 1.5}, "DEFAULT_TTR must be an integer"),
    ({"NOTIFY_CHANNEL": "x" * 64}, "NOTIFY_CHANNEL must be a non-empty string of at most 63 bytes"),
    ({"NOTIFY_CHANNEL": "é" * 32}, "at most 63 bytes"),  # 64 bytes in UTF-8
    ({"RETENTION": 7}, "RETENTION must be a non-negative timedelta"),
    ({"RUN_BATCH_SIZE": 0}, "RUN_BATCH_SIZE must be >= 1, got 0"),
    ({"PARTITION_INTERVAL": "year"}, "PARTITION_INTERVAL must be one of hour, day, week, month"),
    ({"SCAN_INTERVALL": 5}, "unknown key 'SCAN_INTERVALL'"),
])
def test_invalid_settings_are_reported_one_by_one(given, message):
    with override_settings(TIMEOUTS=given):
        problems = checks.check_settings()
    assert ids(problems) == ["timeouts.E003"]
    assert message in problems[0].msg


def test_several_problems_each_get_a_message():
    with override_settings(TIMEOUTS={"SCAN_BATCH_SIZE": 0, "DEFAULT_MAX_ATTEMPTS": "3"}):
        assert ids(checks.check_settings()) == ["timeouts.E003", "timeouts.E003"]


@pytest.mark.parametrize(("interval", "horizon", "ok"), [
    ("hour", 3599, True), ("hour", 3600, False), ("day", 86400.0, False), ("day", 3600, True),
])
def test_the_notify_horizon_must_be_shorter_than_a_partition(interval, horizon, ok):
    with override_settings(TIMEOUTS={"PARTITION_INTERVAL": interval, "NOTIFY_HORIZON": horizon}):
        problems = checks.check_settings()
    assert ids(problems) == ([] if ok else ["timeouts.E004"])


def test_a_valid_custom_setting_passes():
    with override_settings(TIMEOUTS={"RETENTION": timedelta(days=30), "NOTIFY_CHANNEL": "é" * 31}):
        assert checks.check_settings() == []


def test_missing_beat_entries_are_reported(monkeypatch):
    monkeypatch.setitem(app.conf, "beat_schedule", {"other": {"task": "shop.tick", "schedule": 5}})
    problems = checks.check_celery()
    assert ids(problems) == ["timeouts.W002"]
    assert "timeouts.scan and timeouts.maintain" in problems[0].msg
    monkeypatch.setitem(app.conf, "beat_schedule", {"renamed": {"task": "timeouts.scan", "schedule": 1},
                                                    "m": {"task": "timeouts.maintain", "schedule": 60}})
    assert checks.check_celery() == []


def test_no_celery_app_loaded(monkeypatch):
    monkeypatch.setattr(checks, "_celery_app", lambda: None)
    assert ids(checks.check_celery()) == ["timeouts.W001"]


def test_handler_queues_must_exist_when_queues_are_declared(monkeypatch):
    # tests/testapp registers "test.queued" on the queue "timeouts-test-other".
    assert registry.find_handler("test.queued").queue == "timeouts-test-other"
    monkeypatch.setitem(app.conf, "task_queues", None)
    assert checks.check_celery() == []  # queues are created on first use
    monkeypatch.setitem(app.conf, "task_queues", [Queue("celery")])
    problems = checks.check_celery()
    # One message per queue, naming every handler on it (tests/settings.py's TASKS serves that queue too).
    assert ids(problems) == ["timeouts.W003"] and "'test.queued' run on queue 'timeouts-test-other'" in problems[0].msg
    assert "Handlers 'tasks:default:timeouts-test-other', 'test.queued'" in problems[0].msg
    monkeypatch.setitem(app.conf, "task_create_missing_queues", False)
    assert ids(checks.check_celery()) == ["timeouts.E005"]
    monkeypatch.setitem(app.conf, "task_queues", [Queue("celery"), Queue("timeouts-test-other")])
    assert checks.check_celery() == []
    monkeypatch.setitem(app.conf, "task_queues", None)
    assert ids(checks.check_celery()) == ["timeouts.E005"]  # only the default queue exists then


def test_check_command_shows_the_messages():
    expected = r"\(timeouts\.E003\) TIMEOUTS setting: NOTIFY_CHANNEL must be"
    with override_settings(TIMEOUTS={"NOTIFY_CHANNEL": "x" * 70}), pytest.raises(SystemCheckError, match=expected):
        call_command("check")


def test_handlers_that_would_reconnect_for_every_task_are_warned_about(settings, monkeypatch):
    from django.db import connections

    assert "timeouts.W004" not in ids(checks.check_celery())  # the project keeps its connections
    settings.CELERY_DB_REUSE_MAX = None
    assert ids(checks.check_celery()) == ["timeouts.W004"]
    settings.CELERY_DB_REUSE_MAX = 1000
    monkeypatch.setitem(connections.settings["default"], "CONN_MAX_AGE", 0)
    [problem] = checks.check_celery()
    assert problem.id == "timeouts.W004" and "CONN_MAX_AGE is 0" in problem.msg


THREE_SHARDS = ["default", "shard_b", "shard_c"]


def atomic_requests(monkeypatch, *aliases):
    from django.db import connections

    for alias in aliases:
        monkeypatch.setitem(connections.settings[alias], "ATOMIC_REQUESTS", True)


def test_atomic_requests_with_one_shard_change_nothing(monkeypatch):
    atomic_requests(monkeypatch, "default")
    assert checks.check_transactional_scheduling() == []


def test_atomic_requests_on_default_with_other_shards_and_no_router_are_warned_about(monkeypatch):
    atomic_requests(monkeypatch, "default")
    with override_settings(TIMEOUTS={"SHARDS": THREE_SHARDS}):
        [problem] = checks.check_transactional_scheduling()
    assert problem.id == "timeouts.W007"
    assert "ATOMIC_REQUESTS" in problem.msg and "'shard_b', 'shard_c'" in problem.msg
    assert "refused" in problem.msg and "SHARD_ROUTER" in problem.hint
    with override_settings(TIMEOUTS={"SHARDS": THREE_SHARDS, "SHARD_ROUTER": "shop.routing.timeout_shard"}):
        assert checks.check_transactional_scheduling() == []
    atomic_requests(monkeypatch, "shard_b", "shard_c")  # every shard inside the view's transaction
    with override_settings(TIMEOUTS={"SHARDS": THREE_SHARDS}):
        assert checks.check_transactional_scheduling() == []


def test_atomic_requests_on_a_database_that_holds_no_shard_refuse_every_task_of_a_view(monkeypatch):
    atomic_requests(monkeypatch, "default")
    for timeouts_setting in ({"SHARDS": ["shard_b", "shard_c"]},
                             {"SHARDS": ["shard_b", "shard_c"], "SHARD_ROUTER": "shop.routing.timeout_shard"}):
        with override_settings(TIMEOUTS=timeouts_setting):
            [problem] = checks.check_transactional_scheduling()
        assert problem.id == "timeouts.W007" and "every task" in problem.msg


def test_atomic_requests_on_a_database_that_is_neither_default_nor_a_shard_do_not_count(monkeypatch):
    atomic_requests(monkeypatch, "shard_c")
    with override_settings(TIMEOUTS={"SHARDS": ["default", "shard_b"]}):
        assert checks.check_transactional_scheduling() == []
