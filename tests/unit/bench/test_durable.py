"""The durable_restart scenario's counts: calls run twice, split by whether the kill explains them;
late calls, and how fast the new worker ran them."""

from datetime import UTC, datetime, timedelta

from benchmarks.durable import _late, _twice

BASE = datetime(2026, 1, 1, tzinfo=UTC)


def at(seconds):
    return BASE + timedelta(seconds=seconds)


def test_a_call_started_just_before_the_kill_and_again_after_the_restart_ran_twice_at_the_kill():
    expected = {1: at(0), 2: at(0), 3: at(0)}
    starts = [(1, at(9.998)), (1, at(16)), (2, at(9)), (3, at(20))]

    out = _twice(expected, starts, killed_at=at(10).timestamp(), restarted_at=at(15).timestamp())

    assert out == {"duplicates_at_kill": 1, "duplicates_other": 0, "twice_started_before_kill_ms": 2.0}


def test_calls_run_twice_on_one_side_of_the_kill_are_counted_apart():
    expected = {1: at(0), 2: at(0), 3: at(0)}
    starts = [(1, at(8)), (1, at(9)), (2, at(16)), (2, at(17)), (3, at(9)), (3, at(16)), (3, at(17))]

    out = _twice(expected, starts, killed_at=at(10).timestamp(), restarted_at=at(15).timestamp())

    assert out == {"duplicates_at_kill": 0, "duplicates_other": 4, "twice_started_before_kill_ms": None}


def test_a_call_started_as_the_signal_was_sent_ran_twice_at_the_kill():
    """killed_at is read just before the signal: the killed worker may still start a call after it."""
    expected = {1: at(0)}
    starts = [(1, at(10.002)), (1, at(16))]

    out = _twice(expected, starts, killed_at=at(10).timestamp(), restarted_at=at(15).timestamp())

    assert out == {"duplicates_at_kill": 1, "duplicates_other": 0, "twice_started_before_kill_ms": -2.0}


def test_the_catch_up_rate_counts_the_late_calls_the_new_worker_started_leaving_out_stragglers():
    # Killed at 10 s, back at 15 s: 100 calls due 10-15 s start 100 a second from 15 s, but two
    # start at 30 s (found when their leases ran out); 50 calls due later start on time.
    expected = {k: at(10 + k * 0.05) for k in range(100)} | {k: at(30 + k) for k in range(100, 150)}
    starts = [(k, at(15 + k * 0.01)) for k in range(98)] + [(98, at(30)), (99, at(30.01))]
    starts += [(k, at(30 + k + 0.001)) for k in range(100, 150)]

    out = _late(expected, starts, at(10).timestamp(), at(15).timestamp())

    assert (out["late"], out["late_in_outage"], out["late_outside_outage"], out["due_in_outage"]) == (100, 100, 0, 100)
    assert out["catch_up_per_s"] == 100.0


def test_no_catch_up_rate_without_a_backlog():
    expected = {k: at(k) for k in range(50)}
    starts = [(k, at(k + 0.001)) for k in range(50)]

    assert _late(expected, starts, at(100).timestamp(), at(105).timestamp())["catch_up_per_s"] is None
