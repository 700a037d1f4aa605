"""The lateness policy's rules (timeouts.limiting.lateness; validation.check_lateness_policy): what
@timeouts.handler refuses with ImproperlyConfigured, naming the mistake, and how a task a late start
ended is told apart."""

from datetime import timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured

import timeouts
from timeouts import registry
from timeouts.errors import InvalidOption
from timeouts.limiting import lateness
from timeouts.states import Status
from timeouts.validation import check_lateness_policy

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def name():
    yield "test.lateness"
    registry.unregister("test.lateness")


def handle(task):
    pass


@pytest.mark.parametrize("options, message", [
    ({"max_lateness": timedelta(0)}, r"max_lateness must be a positive timedelta or None \(no limit\), got "
                                     r"datetime.timedelta\(0\)"),
    ({"max_lateness": timedelta(seconds=-1)}, "max_lateness must be a positive timedelta"),
    ({"max_lateness": 300}, "max_lateness must be a positive timedelta or None .*, got 300"),
    ({"max_lateness": 2.5}, "max_lateness must be a positive timedelta .*, got 2.5"),
    ({"max_lateness": "5m"}, "max_lateness must be a positive timedelta .*, got '5m'"),
    ({"max_lateness": True}, "max_lateness must be a positive timedelta .*, got True"),
    ({"on_late": "drop"}, "on_late must be 'run', 'skip' or 'dead', got 'drop'"),
    ({"on_late": None}, "on_late must be 'run', 'skip' or 'dead', got None"),
    ({"on_late": ["skip"]}, "on_late must be 'run', 'skip' or 'dead', got a value of type list"),
    ({"on_late": "skip"}, "on_late='skip' needs a max_lateness: how late a start may come before the task is "
                          "skipped instead"),
    ({"on_late": "dead", "max_lateness": None}, "on_late='dead' needs a max_lateness: .* made dead instead"),
])
def test_a_bad_policy_is_refused_naming_the_mistake(name, options, message):
    with pytest.raises(ImproperlyConfigured, match=f"handler 'test.lateness': {message}"):
        timeouts.handler(name, **options)
    assert registry.find_handler(name) is None


@pytest.mark.parametrize("options, policy", [
    ({}, (None, "run")),
    ({"max_lateness": timedelta(minutes=5)}, (timedelta(minutes=5), "run")),
    ({"max_lateness": timedelta(microseconds=1), "on_late": "skip"}, (timedelta(microseconds=1), "skip")),
    ({"max_lateness": timedelta(days=3650), "on_late": "dead"}, (timedelta(days=3650), "dead")),
])
def test_a_good_policy_is_the_handlers(name, options, policy):
    timeouts.handler(name, **options)(handle)
    found = registry.find_handler(name)
    assert (found.max_lateness, found.on_late) == policy


def test_the_error_is_the_one_asked_for():
    with pytest.raises(InvalidOption, match="on_late must be"):
        check_lateness_policy(None, "later", InvalidOption)
    assert check_lateness_policy(timedelta(seconds=1), "skip", InvalidOption) == (timedelta(seconds=1), "skip")


@pytest.mark.parametrize("status, last_error, ended", [
    (Status.CANCELLED, "not run: started 12.3 s after its time, over max_lateness 5 s (on_late=skip)", True),
    (Status.DEAD, "not run: started 12.3 s after its time, over max_lateness 5 s (on_late=dead)", True),
    (Status.PENDING, "not run: started 12.3 s after its time, over max_lateness 5 s (on_late=dead)", False),  # requeued
    (Status.DEAD, "Traceback (most recent call last): ...", False),
    (Status.CANCELLED, "", False),
])
def test_a_task_a_late_start_ended_is_told_by_its_status_and_last_error(status, last_error, ended):
    assert lateness.ended_late(status, last_error) is ended
