"""What each kind of work counts as the end of its attempt (worker/attempt.py's Kind): a handler's
error is retried; a Celery call ends DONE on Retry or Ignore, DEAD on Reject or any other error.
The whole path, with the database: tests/integration (state_machine, durable, call_starts)."""

import pytest
from celery.exceptions import Ignore, Reject, Retry

from timeouts.durable.attempt import Call
from timeouts.worker.attempt import DONE
from timeouts.worker.running import HANDLER


def ending(kind, exc):
    try:
        raise exc
    except BaseException as raised:
        return kind.ending(None, raised)


def test_a_handlers_error_is_retried_with_its_traceback():
    outcome, error = ending(HANDLER, ValueError("boom"))
    assert outcome == "retry" and error.startswith("Traceback") and "ValueError: boom" in error


@pytest.mark.parametrize(("exc", "expected"), [
    (Retry("again", when=5), ("done", "retried: ")),
    (Ignore(), DONE),
    (Reject("bad", requeue=False), ("dead", "rejected: 'bad'")),
    (SystemExit(3), ("dead", "Traceback")),
    (ValueError("boom"), ("dead", "Traceback")),
])
def test_a_calls_ending(exc, expected):
    outcome, error = ending(Call(None, None, (), {}), exc)
    assert outcome == expected[0] and error.startswith(expected[1])


def test_only_a_handlers_done_joins_the_next_start_and_only_a_calls_error_goes_on_to_celery():
    assert HANDLER.joins_next_start and not HANDLER.reraises
    call = Call(None, None, (), {})
    assert call.reraises and not call.joins_next_start
