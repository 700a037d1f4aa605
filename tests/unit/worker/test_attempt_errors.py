"""What a failed attempt stores as its error, and which exceptions are the worker stopping rather
than the attempt failing (attempt.error_text, attempt.stops_the_worker)."""

import asyncio

import pytest
from billiard import common
from celery.exceptions import WorkerShutdown, WorkerTerminate

from timeouts.worker.attempt import MAX_ERROR_LENGTH, error_text, stops_the_worker


def test_an_error_text_writes_what_postgresql_refuses_as_python_escapes():
    assert error_text("a\x00b") == "a\\x00b"
    assert error_text("file caf\udce9.txt") == "file caf\\udce9.txt"  # a lone surrogate
    assert error_text("déjà vu \\x00 ✓") == "déjà vu \\x00 ✓"


def test_an_error_text_keeps_its_end_within_the_limit_after_escaping():
    text = error_text("\x00" * MAX_ERROR_LENGTH + "the end")
    assert len(text) == MAX_ERROR_LENGTH and text.endswith("\\x00the end")


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), WorkerShutdown(0), WorkerTerminate(1)])
def test_an_interrupt_or_the_workers_shutdown_stops_the_worker(exc):
    assert stops_the_worker(exc)


def test_gevent_or_eventlet_killing_the_greenlet_stops_the_worker():
    greenlet = pytest.importorskip("greenlet")  # gevent's and eventlet's, installed with either
    assert stops_the_worker(greenlet.GreenletExit())


@pytest.mark.parametrize("exc", [SystemExit(3), asyncio.CancelledError(), GeneratorExit(), ValueError()])
def test_the_codes_own_base_exception_is_a_failure(exc):
    assert not stops_the_worker(exc)


def test_anything_raised_once_billiards_sigterm_handler_ran_stops_the_worker(monkeypatch):
    monkeypatch.setattr(common, "_should_have_exited", [True])
    assert stops_the_worker(SystemExit(-15)) and stops_the_worker(ValueError("a cleanup that failed"))
