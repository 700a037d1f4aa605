"""The durable_restart scenario's counts: calls run twice, split by whether the kill explains them;
late calls, how fast the new worker ran them, and against what."""

from datetime import UTC, datetime, timedelta

from benchmarks.durable import _late, _twice, ratios, targets

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


def test_late_calls_in_the_outages_catch_up_are_not_counted_outside_it():
    # Killed at 10 s, back at 15 s (T = 5 s), 10 calls falling due a second (A), the new worker
    # running 20 a second (C): the catch-up lasts T x A / (C - A) = 5 s, to 20 s, when the worker
    # reaches the calls due then. One call due at 25 s starts 2 s late, after the catch-up.
    due = {k: at(k / 10) for k in range(300)}
    starts = [(k, at(k / 10 + 0.001)) for k in range(100)]  # on time before the kill
    starts += [(k, at(15 + (k - 100) / 20)) for k in range(100, 300) if k != 250]  # from 15 s, 20 a second
    starts += [(250, at(27))]
    out = _late(due, starts, at(10).timestamp(), at(15).timestamp(), due_per_s=10)

    assert out["catch_up_per_s"] == 20.0
    # Late over 1 s: the 50 due in the outage, the 30 due from 15 s that waited behind them, and the one.
    assert (out["late"], out["late_in_outage"], out["late_outside_outage"]) == (81, 50, 31)
    assert out["late_outside_catch_up"] == 1
    assert out["late_outside_catch_up_calls"] == [(15.0, 2.0)]  # due 15 s after the kill, 2 s late


def test_calls_the_kill_took_before_they_started_are_the_outages_unless_their_lease_made_them_later():
    # As above. Calls 97-99, due just before the kill, had not started: the new worker runs 97 and
    # 98 first, in the catch-up; the killed worker held 99 and 100, which run only once their lease
    # runs out, at 30 s, after the catch-up.
    due = {k: at(k / 10) for k in range(300)}
    starts = [(k, at(k / 10 + 0.001)) for k in range(97)]
    starts += [(k, at(15 + (k - 97) / 20)) for k in range(97, 300) if k not in (99, 100)]
    starts += [(99, at(30)), (100, at(30))]
    out = _late(due, starts, at(10).timestamp(), at(15).timestamp(), due_per_s=10)

    assert out["late_outside_catch_up"] == 2
    assert out["late_outside_catch_up_calls"] == [(-0.1, 20.1), (0.0, 20.0)]


def test_calls_late_before_the_kill_are_not_the_outages():
    due = {k: at(k / 10) for k in range(300)}
    starts = [(k, at(k / 10 + (2 if k == 50 else 0.001))) for k in range(100)]
    starts += [(k, at(15 + (k - 100) / 20)) for k in range(100, 300)]
    out = _late(due, starts, at(10).timestamp(), at(15).timestamp(), due_per_s=10)

    assert out["late_outside_catch_up_calls"] == [(-5.0, 2.0)]


def test_a_worker_no_faster_than_calls_fall_due_is_given_no_catch_up():
    due = {k: at(k / 10) for k in range(300)}
    starts = [(k, at(15 + k / 10)) for k in range(100, 300)] + [(k, at(k / 10)) for k in range(100)]
    out = _late(due, starts, at(10).timestamp(), at(15).timestamp(), due_per_s=10)

    # Only the calls that started within LATE of the worker's return are the outage's: none here.
    assert out["late_outside_catch_up"] == out["late"] > 0


def test_the_catch_up_is_compared_with_celery_directs_drain_of_the_same_repeat():
    runs = [{"scenario": "durable_restart", "path": "durable", "rep": 0, "catch_up_per_s": 400.0},
            {"scenario": "drain", "path": "celery", "rep": 0, "start_per_s": 800.0},
            {"scenario": "durable_restart", "path": "durable", "rep": 1, "catch_up_per_s": 300.0},
            {"scenario": "drain", "path": "celery", "rep": 1, "start_per_s": 1000.0},
            {"scenario": "durable_restart", "path": "durable", "rep": 2, "catch_up_per_s": None}]

    ratio = ratios(runs)["durable_restart"]["durable/celery_drain"]["catch_up_per_s"]

    assert (ratio["min"], ratio["max"]) == (0.3, 0.5)
    checks = {name: check(value) for _, name, value, check in targets({}, ratios(runs)) if value is not None}
    assert checks == {"durable_restart: DurableTask's catch-up / Celery direct's drain (drain scenario) >= 0.8": False}


def test_no_catch_up_ratio_without_the_drain():
    runs = [{"scenario": "durable_restart", "path": "durable", "rep": 0, "catch_up_per_s": 400.0}]

    assert "durable_restart" not in ratios(runs)
