"""The late_recovery scenario's numbers, from a run's tasks: when the on-time stream is on time again,
what was lost, run twice or skipped against the policy; its ratios, targets and table."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from benchmarks import late_recovery, report
from benchmarks.handlers import MUST_RUN, SKIPPABLE
from benchmarks.late_recovery import BACKLOG, STREAM, Row, outcome, recovery_time
from tests.unit.bench.sections import sections
from timeouts.limiting.lateness import NOT_RUN
from timeouts.states import Status

pytestmark = pytest.mark.timeout(30)

BASE = datetime(2026, 1, 1, tzinfo=UTC)
ON_TIME = timedelta(milliseconds=100)


def at(seconds):
    return BASE + timedelta(seconds=seconds)


def ms(milliseconds):
    return timedelta(milliseconds=milliseconds)


def test_recovery_runs_from_the_restart_to_the_first_task_from_which_on_every_one_is_on_time():
    # Due every half second from the restart at 10 s: late while the backlog drains, then on time,
    # but for one late task at 11.5 s.
    lateness = [ms(3000), ms(2500), ms(20), ms(150), ms(30), ms(10), ms(5)]
    series = [(at(10 + i / 2), late) for i, late in enumerate(lateness)]

    assert recovery_time(series, at(10), ON_TIME) == 2.0  # from the task due at 12 s on
    assert recovery_time(list(reversed(series)), at(10), ON_TIME) == 2.0  # in any order


def test_a_task_that_never_started_is_late():
    series = [(at(10), ms(10)), (at(11), None), (at(12), ms(10))]

    assert recovery_time(series, at(10), ON_TIME) == 2.0


def test_recovery_is_zero_when_no_task_was_late_and_none_when_the_last_one_is():
    assert recovery_time([(at(10.5), ms(10)), (at(11), ms(99))], at(10), ON_TIME) == 0.0
    assert recovery_time([(at(10.5), ms(10)), (at(11), ms(101))], at(10), ON_TIME) is None
    assert recovery_time([], at(10), ON_TIME) is None


def run(policy=True, **more):
    """A run's tasks: restart at 60 s; backlog due 0-60 s, half skippable; stream due from 60 s."""
    restarted = at(60)
    rows = [
        # The backlog: skipped (over 5 s late) with the policy, run otherwise.
        Row(SKIPPABLE, f"{BACKLOG}0", at(1), Status.CANCELLED,
            f"{NOT_RUN}61.0 s after its time, over max_lateness 5 s (on_late=skip)", at(62), 0, None),
        Row(MUST_RUN, f"{BACKLOG}1", at(2), Status.DONE, "", at(64), 1, at(63.9)),
        Row(SKIPPABLE, f"{BACKLOG}2", at(58), Status.DONE, "", at(62.5), 1, at(62.4)),  # within 5 s: ran
        Row(MUST_RUN, f"{BACKLOG}3", at(59), Status.DONE, "", at(66), 1, at(65.9)),
        # The stream: late until the backlog is done, on time from 66 s on.
        Row(MUST_RUN, f"{STREAM}0", at(60), Status.DONE, "", at(64.1), 1, at(64)),
        Row(MUST_RUN, f"{STREAM}1", at(65), Status.DONE, "", at(66.1), 1, at(66)),
        Row(MUST_RUN, f"{STREAM}2", at(66), Status.DONE, "", at(66.02), 1, at(66.01)),
        Row(MUST_RUN, f"{STREAM}3", at(67), Status.DONE, "", at(67.02), 1, at(67.005)),
    ]
    return rows, restarted


def test_a_run_with_the_policy_counts_its_skipped_tasks_and_times_its_recovery():
    rows, restarted = run()

    out = outcome(rows, policy=True, restarted=restarted)

    assert out["recovery_s"] == 6.0 and out["stream_late"] == 2 and out["stream_p99_after_ms"] == 10.0
    assert out["back_s"] == 2.0  # the first start after the restart, here the skip of the first task
    assert out["drain_s"] == 5.9  # the backlog's last start
    assert out["n"] == 8 and out["started"] == 7 and out["skipped"] == 1
    assert out["missing"] == out["duplicates"] == out["early"] == 0
    assert out["skip_errors"] == out["run_over_policy"] == 0


def test_a_task_skipped_without_the_policy_or_within_max_lateness_was_skipped_wrongly():
    rows, restarted = run()
    assert outcome(rows, policy=False, restarted=restarted)["skip_errors"] == 1  # the policy was overridden
    within = replace(rows[0], finished_at=at(5.5))  # ended 4.5 s late
    assert outcome([within, *rows[1:]], policy=True, restarted=restarted)["skip_errors"] == 1
    cancelled = Row(SKIPPABLE, f"{BACKLOG}0", at(1), Status.CANCELLED, "", at(62), 0, None)  # not by a late start
    out = outcome([cancelled, *rows[1:]], policy=True, restarted=restarted)
    assert out["skip_errors"] == 1 and out["missing"] == 1 and out["skipped"] == 0


def test_lost_twice_early_and_run_over_the_policy_are_counted():
    rows, restarted = run()
    rows[1] = Row(MUST_RUN, f"{BACKLOG}1", at(2), Status.DISPATCHED, "", None, 0, None)  # never started
    rows[3] = Row(MUST_RUN, f"{BACKLOG}3", at(59), Status.DONE, "", at(66), 2, at(65.9))  # started twice
    rows[2] = Row(SKIPPABLE, f"{BACKLOG}2", at(58), Status.DONE, "", at(64), 1, at(63.5))  # 5.5 s late, ran
    rows[7] = Row(MUST_RUN, f"{STREAM}3", at(67), Status.DONE, "", at(67.02), 1, at(66.99))  # before its time

    out = outcome(rows, policy=True, restarted=restarted)

    assert (out["missing"], out["duplicates"], out["early"], out["run_over_policy"]) == (1, 1, 1, 1)
    assert outcome(rows, policy=False, restarted=restarted)["run_over_policy"] == 0  # no policy in force


def runs_of_one_repeat(rep, without, with_policy):
    def one(variant, recovery):
        return {"scenario": "late_recovery", "path": variant, "rep": rep, "recovery_s": recovery, "back_s": 2.0,
                "drain_s": recovery, "stream_late": 10, "stream_p99_after_ms": 5.0, "skipped": 0, "n": 100,
                "missing": 0, "duplicates": 0, "early": 0, "skip_errors": 0, "run_over_policy": 0}
    return [one("no_policy", without), one("policy", with_policy)]


def test_the_scenario_has_its_ratio_targets_and_table():
    runs = runs_of_one_repeat(0, 12.0, 5.0) + runs_of_one_repeat(1, 12.0, 8.0)
    summary = report.aggregate(runs)
    ratios = late_recovery.ratios(runs)
    assert ratios["late_recovery"]["no_policy/policy"]["recovery_s"]["median"] == pytest.approx((2.4 + 1.5) / 2)
    checks = {name: (value, check(value)) for _, name, value, check in late_recovery.targets(summary, ratios)}
    assert checks["late_recovery: on time again after the outage, without the policy / with it >= 2"] == (1.95, False)
    assert checks["late_recovery: lost + run twice + early = 0 (every run, both variants)"] == (0, True)
    tables = {title.split(":")[0]: rows for title, _, rows in sections(summary, ratios)}
    assert [row[0] for row in tables["late_recovery"]] == [late_recovery.LABELS[v] for v in ("policy", "no_policy")]
