"""@timeouts.handler refuses a bad registration with ImproperlyConfigured, at import time."""

import pytest
from django.core.exceptions import ImproperlyConfigured

import timeouts
from timeouts import registry


@pytest.fixture
def name():
    yield "test.registration"
    registry.unregister("test.registration")


def first(task):
    pass


def second(task):
    pass


@pytest.mark.parametrize("bad", ["", "x" * 65, "has space", None, 42, b"test.x"])
def test_a_bad_name_is_refused(bad):
    with pytest.raises(ImproperlyConfigured, match="biz_type must be 1 to 64 characters"):
        timeouts.handler(bad)


@pytest.mark.parametrize("options, message", [
    ({"max_attempts": 0}, "max_attempts must be a positive integer"),
    ({"max_attempts": True}, "max_attempts must be a positive integer"),
    ({"ttr": 1.5}, "ttr must be a positive integer"),
    ({"queue": ""}, "queue must be a non-empty string"),
    ({"queue": 3}, "queue must be a non-empty string"),
])
def test_bad_options_are_refused(name, options, message):
    with pytest.raises(ImproperlyConfigured, match=message):
        timeouts.handler(name, **options)
    assert registry.find_handler(name) is None


def test_a_second_handler_for_a_biz_type_is_refused_the_same_one_is_not(name):
    timeouts.handler(name)(first)
    timeouts.handler(name)(first)  # the same function again: a module imported twice
    with pytest.raises(ImproperlyConfigured, match="already has a handler"):
        timeouts.handler(name)(second)
    assert registry.find_handler(name).func is first
