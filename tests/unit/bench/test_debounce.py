"""The debounce scenario's pure parts (benchmarks.debounce): who makes which call, the calls' rate,
and the checks of a run from its rows."""

from collections import Counter
from datetime import UTC, datetime, timedelta

from benchmarks.debounce import analyze, calls_per_s, plan
from timeouts.states import Status

T0 = datetime(2026, 1, 1, tzinfo=UTC)
MAX_WAIT = timedelta(seconds=6)


def s(seconds):
    return T0 + timedelta(seconds=seconds)


def test_the_writers_make_every_call_once_and_each_key_hears_from_every_writer_in_turn():
    keys, calls, writers, block = 23, 10, 4, 5
    plans = [plan(keys, calls, writers, block, writer) for writer in range(writers)]
    made = Counter(call for calls_of_one in plans for call in calls_of_one)
    assert made == Counter({(round_, key): 1 for key in range(keys) for round_ in range(calls)})
    for writer, calls_of_one in enumerate(plans):
        assert all((key + round_) % writers == writer for round_, key in calls_of_one)
        # Block by block, round by round: a key's calls come before the next block's first call.
        blocks = [key // block for _, key in calls_of_one]
        assert blocks == sorted(blocks)
        rounds_of_key = {}
        for round_, key in calls_of_one:
            rounds_of_key.setdefault(key, []).append(round_)
        assert all(rounds == sorted(rounds) for rounds in rounds_of_key.values())
    assert {len(calls_of_one) for calls_of_one in plans} <= {57, 58}  # shared evenly


def test_calls_per_s_is_all_calls_over_the_writers_whole_span():
    results = [{"calls": 100, "started": 10.0, "finished": 14.0}, {"calls": 100, "started": 11.0, "finished": 15.0}]
    assert calls_per_s(results) == 40
    assert calls_per_s([]) is None


def row(key, job_id, status, created, due, started=None, dispatched=None):
    """A task's row: claimed 0.1 s before it is due unless said, and only if it started."""
    if dispatched is None and started is not None:
        dispatched = due - 0.1
    return (key, job_id, status, s(created), s(due), None if dispatched is None else s(dispatched),
            None if started is None else s(started))


def test_a_debounced_run_where_each_key_ran_once_within_its_cap():
    rows = [row("1", 10, Status.DONE, 0, 5, 5.002), row("2", 20, Status.DONE, 1, 7, 7.010)]
    out = analyze(rows, MAX_WAIT)
    assert {k: out[k] for k in ("missing", "duplicates", "early", "over_cap", "keys_run_once", "keys_run_more",
                                "keys_not_run", "capped")} == {
        "missing": 0, "duplicates": 0, "early": 0, "over_cap": 0, "keys_run_once": 2, "keys_run_more": 0,
        "keys_not_run": 0, "capped": 1}
    assert out["first_to_start_max_s"] == 6.01 and out["max_ms"] == 10.0


def test_what_the_checks_catch():
    rows = [
        row("late", 1, Status.DONE, 0, 7, 7.5),  # due past its cap
        row("twice", 2, Status.DONE, 0, 5, 5.1), row("twice", 2, Status.DONE, 0, 5, 5.2),
        row("early", 3, Status.DONE, 0, 5, 4.9),
        row("never", 4, Status.PENDING, 0, 5),
        # a second task created while the first was still PENDING: debounce should have moved it
        row("again", 5, Status.DONE, 0, 4, 4.1), row("again", 6, Status.DONE, 2, 5, 5.1),
        row("cancelled", 7, Status.CANCELLED, 0, 5, 5.1),
        # a second task created by a call after the first was claimed: the rule, not a miss
        row("called late", 8, Status.DONE, 0, 1, 1.1), row("called late", 9, Status.DONE, 0.95, 4, 4.1),
    ]
    out = analyze(rows, MAX_WAIT)
    caught = ("over_cap", "duplicates", "early", "missing", "cancelled_started")
    assert [out[name] for name in caught] == [1, 1, 1, 1, 1]
    assert (out["keys_run_once"], out["keys_run_more"], out["keys_called_late"], out["keys_not_run"]) == (3, 1, 1, 2)
    assert out["keys"] == 7 and out["tasks"] == 9


def test_a_replaced_run_counts_the_cancelled_tasks_as_none_of_the_keys_runs():
    rows = [row("1", 1, Status.CANCELLED, 0, 5), row("1", 2, Status.CANCELLED, 0.1, 5.1),
            row("1", 3, Status.DONE, 0.2, 5.2, 5.21)]
    out = analyze(rows, None)
    assert (out["keys_run_once"], out["missing"], out["over_cap"], out["capped"]) == (1, 0, 0, 0)
    assert out["first_to_start_max_s"] == 5.21
