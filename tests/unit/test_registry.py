"""@timeouts.handler refuses a bad registration with ImproperlyConfigured, at import time."""

import asyncio
import functools

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


def test_a_bare_decorator_without_a_name_is_refused():
    with pytest.raises(ImproperlyConfigured, match=r'use @timeouts.handler\("name"\)'):
        timeouts.handler(first)


@pytest.mark.parametrize("not_callable", [None, "test.registration", 42, object()])
def test_what_cannot_be_called_is_refused(name, not_callable):
    with pytest.raises(ImproperlyConfigured, match="is not callable"):
        timeouts.handler(name)(not_callable)
    assert registry.find_handler(name) is None


def a_generator(task):
    yield task


async def an_async_generator(task):
    yield task


class GeneratorCall:
    def __call__(self, task):
        yield task


@pytest.mark.parametrize("func, message", [
    (a_generator, "is a generator function"),
    (functools.partial(a_generator), "is a generator function"),
    (GeneratorCall(), "is a generator function"),
    (an_async_generator, "is an async generator function"),
    (functools.partial(an_async_generator), "is an async generator function"),
])
def test_a_handler_whose_body_a_call_would_not_run_is_refused(name, func, message):
    with pytest.raises(ImproperlyConfigured, match=message):
        timeouts.handler(name)(func)
    assert registry.find_handler(name) is None


class AsyncCall:
    def __init__(self, ran):
        self.ran = ran

    async def __call__(self, task):
        await asyncio.sleep(0)
        self.ran.append(task)


async def append_to(ran, task):
    await asyncio.sleep(0)
    ran.append(task)
    return "returned"


def wrapped_without_marker(ran):
    """A sync function that returns its coroutine: what a decorator that does not keep the async
    marker makes of a coroutine function. Registration cannot tell; the call still awaits it."""
    def handler(task):
        return append_to(ran, task)
    return handler


@pytest.mark.parametrize("make", [
    lambda ran: functools.partial(append_to, ran),
    AsyncCall,
    wrapped_without_marker,
])
def test_an_async_handler_runs_to_its_end_when_called(name, make):
    ran = []
    timeouts.handler(name)(make(ran))
    registry.find_handler(name)("the task")
    assert ran == ["the task"]


def test_an_async_handler_s_error_is_raised_by_the_call(name):
    @timeouts.handler(name)
    async def failing(task):
        await asyncio.sleep(0)
        raise LookupError(f"failing on purpose for {task}")

    with pytest.raises(LookupError, match="failing on purpose for the task"):
        registry.find_handler(name)("the task")
