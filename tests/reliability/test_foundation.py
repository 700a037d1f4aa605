"""The reliability foundation itself: the checker's definitions on hand-made rows, and one fault-free
end-to-end run (a throwaway PostgreSQL, real worker, dispatcher and scan loop) that must be clean."""

from datetime import UTC, datetime, timedelta

import pytest

from timeouts.states import Status

from .checker import _compare
from .oracle import check

PENDING, DONE, CANCELLED, RUNNING, DEAD = (Status.PENDING, Status.DONE, Status.CANCELLED, Status.RUNNING, Status.DEAD)
NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
WINDOW = timedelta(seconds=10)


def row(job_id, status, attempts=1, max_attempts=5, due=NOW - timedelta(minutes=1)):
    return job_id, {"job_id": job_id, "status": status, "action_time": due, "run_at": due, "attempts": attempts,
                    "max_attempts": max_attempts}


def run(job_id, attempt=1, at=NOW - timedelta(seconds=59), due=NOW - timedelta(minutes=1), intent="ok"):
    return {"job_id": job_id, "attempt": attempt, "action_time": due, "run_at": due, "started_at": at, "ran_at": at,
            "intent": intent, "pid": 1}


def scheduled(*job_ids, outcome="committed"):
    return [{"job_id": job_id, "outcome": outcome} for job_id in job_ids]


def test_a_clean_history_has_no_problems():
    rows = dict([row(1, DONE), row(2, CANCELLED, attempts=0), row(3, DEAD, attempts=3, max_attempts=3)])
    cancels = [{"job_id": 2, "result": True, "cancelled_at": NOW - timedelta(minutes=2)}]
    runs = [run(1), *(run(3, attempt, intent="crash") for attempt in (1, 2, 3))]
    report = _compare(rows, scheduled(1, 2, 3) + scheduled(9, outcome="rolled_back"), cancels, runs, NOW, WINDOW)
    report.assert_clean()
    assert report.counts["committed"] == 3 and report.counts["rolled back"] == 1 and report.counts["runs"] == 4
    assert "no problems" in str(report)


def test_every_kind_of_problem_is_found():
    late_cancel = NOW - timedelta(minutes=5)
    rows = dict([row(1, PENDING), row(2, DONE, attempts=2), row(3, DONE, attempts=1), row(4, CANCELLED, attempts=1),
                 row(5, RUNNING), row(6, DEAD, attempts=2, max_attempts=3),
                 row(7, PENDING, due=NOW + timedelta(seconds=5)), row(8, DONE, attempts=2)])
    runs = [run(2, 1), run(2, 2),  # a rerun without a failure: a duplicate
            run(3, 1), run(3, 1),  # the same attempt twice, and more runs than attempts
            run(4), run(5, at=NOW - timedelta(minutes=2)),  # ran after a True cancel; ran early
            run(6, 1), run(6, 2), run(8, 2), run(10)]  # job 8 attempt 1 unrecorded; job 10 never committed
    cancels = [{"job_id": 4, "result": True, "cancelled_at": late_cancel}]
    report = _compare(rows, scheduled(1, 2, 3, 4, 5, 6, 7, 8, 11), cancels, runs, NOW, WINDOW)
    assert report.lost == [1, 11]  # due long ago, never ran; missing from the table
    assert report.counts["waiting"] == 1  # job 7: not due yet
    assert report.unexpected == [10]
    assert report.ran_after_true_cancel == [4]
    assert [early[:2] for early in report.early] == [(5, 1)]
    assert [job for job, _ in report.double_starts] == [3, 3]
    assert report.duplicates == [(2, 1), (3, 1), (6, 1)] and report.duplicate_runs == 3
    assert [stuck[:2] for stuck in report.stuck] == [(1, "PENDING"), (5, "RUNNING")]
    assert [job for job, _ in report.accounting] == [3, 6, 8]
    with pytest.raises(AssertionError, match="broken guarantees"):
        report.assert_clean(max_duplicates=3, ignore=("lost", "unexpected"))


def test_unknown_outcomes_are_decided_by_the_table_and_duplicates_by_the_limit():
    rows = dict([row(1, DONE, attempts=2), row(3, CANCELLED, attempts=0)])
    runs = [run(1, 1), run(1, 2)]
    cancels = [{"job_id": 3, "result": None, "cancelled_at": NOW}]  # unknown, but the row is CANCELLED
    report = _compare(rows, scheduled(1, 2, 3, outcome="unknown"), cancels, runs, NOW, WINDOW)
    assert report.counts["committed"] == 2 and not report.lost  # job 2 never committed
    report.assert_clean(max_duplicates=1)
    with pytest.raises(AssertionError, match="duplicates"):
        report.assert_clean()


@pytest.mark.reliability
@pytest.mark.timeout(180)
def test_without_faults_every_task_runs_exactly_once_on_time(system, scheduler, oracle):
    worker = system.worker(concurrency=2)
    system.dispatcher()
    system.scanner(interval=1)
    system.wait_worker_ready(worker)
    job_ids = scheduler.schedule_many([{"biz_type": "oracle.ok", "biz_id": i, "delay": 0.5 + i * 0.02}
                                       for i in range(40)])
    cancelled = scheduler.schedule_many([{"biz_type": "oracle.ok", "biz_id": f"c{i}", "delay": 30}
                                         for i in range(5)])
    assert all(scheduler.cancel(job_id) for job_id in cancelled)
    scheduler.schedule_many([{"biz_type": "oracle.ok", "biz_id": "rolled-back", "delay": 0}], rollback=True)
    system.wait_until_final(timeout=60, job_ids=job_ids)
    system.wait_broker_drained(timeout=30)
    report = check(system.database_url, oracle.dsn, recovery_window=10)
    print(report)
    report.assert_clean()
    assert report.counts["runs"] == 40 and report.counts["done"] == 40 and report.counts["cancelled"] == 5
    assert report.max_lateness() < 5
