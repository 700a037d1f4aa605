"""The hand-over between the worker's main-process thread that starts calls ahead and the timer
that sends them to a pool process: each compare-and-set is run by one of the two, never both, and
a start given back (the worker dropped its message) is never handed over."""

import threading
import time

from timeouts.call_starts import _DatabaseClock, _Start

FENCE = [1, "2026-01-01T00:00:00+00:00", 1, None, "default"]


def test_a_start_the_thread_has_not_begun_is_abandoned_and_never_run():
    start = _Start(FENCE)
    assert start.take() is None
    assert start.begin() is False  # the thread skips it: the pool process starts the call itself


def test_a_start_being_run_is_waited_for_and_handed_over():
    start = _Start(FENCE)
    assert start.begin() is True
    started = {"row": {"job_id": 1}, "not_before": 0.0}
    threading.Timer(0.05, start.answer, (started,)).start()
    assert start.take() == started


def test_a_refused_start_hands_over_nothing():
    start = _Start(FENCE)
    assert start.begin() is True
    start.answer(None)
    assert start.take() is None


def test_a_start_given_back_before_it_begins_is_never_run_nor_handed_over():
    start = _Start(FENCE)
    assert start.give_back() is None  # nothing recorded: nothing for the database
    assert start.begin() is False
    assert start.take() is None  # the pool process starts the call itself, if Celery still runs it


def test_a_recorded_start_given_back_is_never_handed_over():
    start = _Start(FENCE)
    assert start.begin() is True
    started = {"row": {"job_id": 1}, "not_before": 0.0}
    assert start.answer(started) is True
    assert start.give_back() == started
    assert start.take() is None


def test_a_start_given_back_while_being_recorded_is_left_to_the_thread_to_give_back():
    start = _Start(FENCE)
    assert start.begin() is True
    assert start.give_back() is None  # its answer has not come yet
    assert start.answer({"row": {"job_id": 1}, "not_before": 0.0}) is False  # the thread gives it back
    assert start.take() is None


def test_the_database_clock_offset_is_the_closest_bound_of_the_window():
    clock = _DatabaseClock()
    assert clock.offset("a", -0.004) == -0.004
    assert clock.offset("a", -0.001) == -0.001
    assert clock.offset("a", -0.003) == -0.001  # a slower answer bounds it less closely
    assert clock.offset("b", 5.0) == 5.0  # each shard's database has a clock of its own


def test_bounds_older_than_the_window_are_dropped():
    clock = _DatabaseClock()
    clock.WINDOW = 0.05
    clock.offset("a", 1.0)
    time.sleep(0.06)
    assert clock.offset("a", 0.5) == 0.5
