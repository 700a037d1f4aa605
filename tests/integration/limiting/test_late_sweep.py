"""The claimers' sweep of late PENDING tasks: it ends, CANCELLED or DEAD as their start would, only
the tasks later than a "skip" or "dead" policy allows, never a paused biz_type's nor a requeued one;
it skips rows a claim or a cancel holds and never waits for them; a cancel that returned True is
never undone, and a task it ended is not cancelled after; it counts what it ended as the start does;
it reads only partitions old enough to hold a late task; the dispatcher sweeps in its loop, the
scan before its claims."""

import re
import threading
import time
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

import timeouts
from tests.support.isolation import no_limits  # noqa: F401  (a fixture)
from tests.support.worker_steps import cancel_and_hold, claim_one, in_thread, sql
from tests.testapp import tasks as durable_tasks
from timeouts import events, metrics, registry
from timeouts.dispatch import late_sweep
from timeouts.dispatch.claiming import claim_due
from timeouts.dispatch.dispatcher import Dispatcher
from timeouts.dispatch.late_sweep import Sweeper, end_late
from timeouts.dispatch.scan import scan
from timeouts.limiting import lateness
from timeouts.models import TimeoutTask
from timeouts.store.queries import QUERIES
from timeouts.worker import running

Status = TimeoutTask.Status
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60), pytest.mark.usefixtures("no_limits")]

ENDED_TEXT = re.compile(r"not run: started (\d+\.\d) s after its time, over max_lateness 5 s \(on_late=(skip|dead)\)")
FIVE_S = timedelta(seconds=5)
CLAIM_PARAMS = {"limit": 50, "lead": 0.0, "max_dispatched": 10_000,
                "attribute_prefixes": registry.attribute_prefixes(), "shard_index": 0, "shard_count": 1}


def scheduled(biz_type="test.record", biz_id=1, ago=30.0):
    """A task due `ago` seconds ago."""
    return TimeoutTask.objects.schedule(biz_type, biz_id, at=datetime.now(UTC) - timedelta(seconds=ago))


def reload(task):
    return TimeoutTask.objects.get(job_id=task.job_id)  # a requeue moves action_time


def psycopg_connection(autocommit=False):
    params = {key: value for key, value in connection.get_connection_params().items()
              if key not in ("cursor_factory", "context")}
    return psycopg.connect(**params, autocommit=autocommit)


@pytest.fixture
def heard():
    """The "late", "cancelled" and "dead" events, as (event, biz_type, count, lateness, on_late)."""
    found = []

    def listener(event, biz_type, count, lateness, on_late=None):
        if event in ("late", "cancelled", "dead"):
            found.append((event, biz_type, count, lateness, on_late))

    events.listen(listener)
    yield found
    events.listeners.remove(listener)


def test_only_tasks_later_than_a_skip_or_dead_policy_end(heard):
    timeouts.set_limits("test.record", max_lateness=FIVE_S, on_late="skip")
    timeouts.set_limits("test.fail", max_lateness=FIVE_S, on_late="dead")
    timeouts.set_limits("test.slow", max_lateness=FIVE_S)  # on_late "run": counted at its start, never ended
    skipped, dead = scheduled("test.record", "late", ago=30), scheduled("test.fail", "late", ago=30)
    left = [scheduled("test.record", "on time", ago=1), scheduled("test.slow", "late", ago=30),
            scheduled("test.async", "late", ago=3600),  # no policy
            TimeoutTask.objects.schedule("test.record", "future", delay=3600)]

    assert end_late() == 2
    for task, status, on_late in ((skipped, Status.CANCELLED, "skip"), (dead, Status.DEAD, "dead")):
        ended = reload(task)
        assert (ended.status, ended.attempts, ended.started_at, ended.lease_until) == (status, 0, None, None)
        assert ended.finished_at is not None and lateness.ended_late(ended.status, ended.last_error)
        late_by, policy = ENDED_TEXT.fullmatch(ended.last_error).groups()
        assert 30 <= float(late_by) < 60 and policy == on_late
    assert [reload(task).status for task in left] == [Status.PENDING] * 4
    assert sorted((event, biz_type, count, on_late) for event, biz_type, count, _, on_late in heard) == [
        ("cancelled", "test.record", 1, None), ("dead", "test.fail", 1, None),
        ("late", "test.fail", 1, "dead"), ("late", "test.record", 1, "skip")]
    assert all(late_by >= 30 for event, *_, late_by, _ in heard if event == "late")
    assert end_late() == 0
    assert {claim.job_id for claim in claim_due(10)} == {task.job_id for task in left[:3]}


def test_without_such_a_policy_only_the_limits_are_read():
    timeouts.set_limits("test.record", max_lateness=FIVE_S)  # on_late "run"
    task = scheduled(ago=3600)
    with CaptureQueriesContext(connection) as captured:
        assert end_late() == 0
    assert [query["sql"] for query in captured] == [QUERIES["late_policies"]]
    assert reload(task).status == Status.PENDING


def test_a_paused_biz_type_is_left_alone_until_resumed():
    timeouts.set_limits("test.record", max_lateness=FIVE_S, on_late="skip")
    timeouts.pause("test.record")
    task = scheduled(ago=30)
    assert end_late() == 0 and reload(task).status == Status.PENDING
    timeouts.resume("test.record")
    assert end_late() == 1 and reload(task).status == Status.CANCELLED


def test_each_biz_type_gives_its_oldest_and_a_statement_ends_at_most_its_limit():
    timeouts.set_limits("test.record", max_lateness=FIVE_S, on_late="skip")
    timeouts.set_limits("test.fail", max_lateness=FIVE_S, on_late="dead")
    for n in range(4):
        scheduled("test.record", f"r{n}", ago=60 - n)
        scheduled("test.fail", f"f{n}", ago=60 - n)
    assert end_late(limit=3) == 3
    assert end_late(limit=3) == 3
    assert end_late(limit=3) == 2
    assert TimeoutTask.objects.filter(status=Status.PENDING).count() == 0


def test_a_requeued_task_runs_however_late(starts):
    timeouts.set_limits("test.record", max_lateness=timedelta(seconds=2), on_late="dead")
    task = scheduled(ago=10)
    assert end_late() == 1
    dead = reload(task)
    assert dead.status == Status.DEAD and dead.requeue() is True
    sql("UPDATE timeouts_task SET run_at = run_at - interval '1 minute', action_time = action_time - interval "
        "'1 minute' WHERE job_id = %s", [task.job_id])  # as if the requeued task waited a minute, later still
    assert end_late() == 0  # the operator asked for it to run
    assert running.run(claim_one().fence) == "done"
    assert reload(task).status == Status.DONE and starts.count() == 1


def test_what_it_ends_is_counted_as_late_starts_are():
    def late_total(on_late):
        return metrics.REGISTRY.get_sample_value("timeouts_late_total",
                                                 {"biz_type": "test.record", "on_late": on_late}) or 0.0

    def cancelled_total():
        return metrics.REGISTRY.get_sample_value("timeouts_cancelled_total", {"biz_type": "test.record"}) or 0.0

    before = late_total("skip"), cancelled_total()
    timeouts.set_limits("test.record", max_lateness=FIVE_S, on_late="skip")
    for n in range(3):
        scheduled(biz_id=n, ago=30)
    assert end_late() == 3
    assert (late_total("skip") - before[0], cancelled_total() - before[1]) == (3, 3)


def test_a_durable_task_call_ends_as_any_task(broker):
    timeouts.set_limits("celery:tests.durable.record", max_lateness=FIVE_S, on_late="skip")
    call = durable_tasks.record.apply_async(("late",), countdown=60)
    sql("UPDATE timeouts_task SET action_time = action_time - interval '2 minutes', run_at = run_at - interval "
        "'2 minutes' WHERE biz_id = %s", [call.id])  # as if it had waited a minute past its eta
    assert end_late() == 1
    [row] = TimeoutTask.objects.filter(biz_id=call.id)
    assert row.status == Status.CANCELLED and row.last_error.endswith("over max_lateness 5 s (on_late=skip)")
    assert claim_due(10) == []


def test_the_sweep_and_the_start_write_the_same_text():
    for name in ("end_late_pending", "start_task"):
        assert QUERIES[name].count(f"'{lateness.NOT_RUN}") == 2  # written, and read for a requeue
    written = "format('not run: started %%s s after its time, over max_lateness %%s s (on_late=%%s)'"
    assert written in QUERIES["end_late_pending"] and written in QUERIES["start_task"]


# --- Races, on separate connections ---------------------------------------------------------------------

@pytest.mark.parametrize("on_late", ["skip", "dead"])
def test_a_cancel_that_returned_true_is_not_undone_and_the_sweep_never_waits_for_it(on_late, starts):
    timeouts.set_limits("test.record", max_lateness=timedelta(seconds=1), on_late=on_late)
    task = scheduled(ago=10)
    canceller, cancel_result, locked, release = cancel_and_hold(task.job_id)
    assert locked.wait(10)
    started = time.monotonic()
    sweeper, swept = in_thread(end_late)
    sweeper.join(5)
    assert swept == {"value": 0} and time.monotonic() - started < 5  # skipped the row, did not wait
    release.set()
    canceller.join(10)
    assert cancel_result["value"] is True
    assert end_late() == 0
    after = reload(task)
    assert (after.status, after.last_error) == (Status.CANCELLED, "")
    assert claim_due(10) == [] and starts.count() == 0


def test_a_cancel_that_comes_after_the_sweep_ended_a_task_returns_false():
    timeouts.set_limits("test.record", max_lateness=timedelta(seconds=1), on_late="skip")
    task = scheduled(ago=10)
    params = {"min_lateness": 1.0, "limit": 10}
    with psycopg_connection() as sweeping:
        [row] = sweeping.execute(QUERIES["end_late_pending"], params).fetchall()  # its transaction holds the row
        canceller, cancel_result = in_thread(lambda: TimeoutTask.objects.get(job_id=task.job_id).cancel())
        waiting_for_a_row_lock()
        sweeping.commit()
    canceller.join(10)
    assert row[0] == task.job_id and cancel_result["value"] is False
    after = reload(task)
    assert after.status == Status.CANCELLED and after.last_error.endswith("over max_lateness 1 s (on_late=skip)")
    assert claim_due(10) == []


def test_rows_a_claim_holds_are_skipped_and_stay_the_claims():
    timeouts.set_limits("test.record", max_lateness=FIVE_S, on_late="skip")
    tasks = [scheduled(biz_id=n, ago=30 + n) for n in range(4)]
    with psycopg_connection() as claiming:
        claimed = claiming.execute(QUERIES["claim_due"], {**CLAIM_PARAMS, "limit": 2}).fetchall()
        started = time.monotonic()
        assert end_late() == 2 and time.monotonic() - started < 5  # the two others, without waiting
        claiming.commit()
    by_status = {task.job_id: reload(task).status for task in tasks}
    assert sorted(by_status.values()) == [Status.DISPATCHED, Status.DISPATCHED, Status.CANCELLED, Status.CANCELLED]
    assert {row[0] for row in claimed} == {job_id for job_id, s in by_status.items() if s == Status.DISPATCHED}
    assert end_late() == 0  # a claimed task is its start's to end (sql/queries/attempts.sql)


def test_rows_the_sweep_holds_are_skipped_by_a_claim():
    timeouts.set_limits("test.record", max_lateness=FIVE_S, on_late="skip")
    late, on_time = scheduled(biz_id="late", ago=30), scheduled(biz_id="on time", ago=1)
    with psycopg_connection() as sweeping:
        sweeping.execute(QUERIES["end_late_pending"], {"min_lateness": 5.0, "limit": 10})
        assert [claim.job_id for claim in claim_due(10)] == [on_time.job_id]
        sweeping.commit()
    assert (reload(late).status, reload(on_time).status) == (Status.CANCELLED, Status.DISPATCHED)


POLICIES = "    FROM timeouts_limits AS l\n    WHERE l.on_late_in_force"
# The sweep, paused after its snapshot is taken and before its scans lock a row: its policies come first.
PAUSED_SWEEP = QUERIES["end_late_pending"].replace(
    POLICIES, "    FROM timeouts_limits AS l, (SELECT pg_sleep(1)) AS pause\n    WHERE l.on_late_in_force")


def test_a_sweep_that_meets_rows_changed_since_its_snapshot_ends_every_other_row_it_chose():
    """PostgreSQL rechecks each such row (EvalPlanQual) and passes it over, on 18 as on 15: the
    sweep prunes partitions only when it starts, as the claim's locking scans do (claims.sql)."""
    assert POLICIES in QUERIES["end_late_pending"]
    timeouts.set_limits("test.record", max_lateness=FIVE_S, on_late="skip")
    tasks = [scheduled(biz_id=n, ago=60 - n) for n in range(20)]
    old = TimeoutTask.objects.schedule("test.record", "old", at=datetime.now(UTC) - timedelta(days=60))  # DEFAULT
    cancelled, claimed = tasks[0], tasks[1]
    paused = {}
    with psycopg_connection(autocommit=True) as sweeping:

        def sweep_paused():
            paused["rows"] = sweeping.execute(PAUSED_SWEEP, {"min_lateness": 5.0, "limit": 100}).fetchall()

        thread = threading.Thread(target=sweep_paused)
        thread.start()
        time.sleep(0.3)
        assert TimeoutTask.objects.get(job_id=cancelled.job_id).cancel() is True
        sql("UPDATE timeouts_task SET status = %s, dispatched_at = now(), lease_until = now() + interval '1 minute' "
            "WHERE job_id = %s", [Status.DISPATCHED, claimed.job_id])  # as a claim commits it
        thread.join(30)
    assert {row[0] for row in paused["rows"]} == {task.job_id for task in tasks[2:]} | {old.job_id}
    assert (reload(cancelled).status, reload(cancelled).last_error) == (Status.CANCELLED, "")
    assert reload(claimed).status == Status.DISPATCHED
    assert {reload(task).status for task in tasks[2:] + [old]} == {Status.CANCELLED}


def waiting_for_a_row_lock():
    """Until another session of this database waits for a lock (read on this connection)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                           "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()")
            if cursor.fetchone()[0]:
                return
        time.sleep(0.02)
    raise AssertionError("no session waits for the row lock")


# --- Partitions ---------------------------------------------------------------------------------------

def test_only_partitions_old_enough_to_hold_a_late_task_are_read():
    timeouts.set_limits("test.record", max_lateness=timedelta(days=3), on_late="skip")
    with connection.cursor() as cursor:
        cursor.execute("SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits AS i "
                       "JOIN pg_class AS c ON c.oid = i.inhrelid "
                       "WHERE i.inhparent = 'timeouts_task'::regclass AND c.relkind = 'r'")
        partitions = dict(cursor.fetchall())
        cursor.execute("EXPLAIN " + QUERIES["end_late_pending"],
                       {"min_lateness": 3 * 86400.0, "limit": 10})
        # The scans, not the UPDATE's list of the partitions it could write to.
        plan = "\n".join(row[0] for row in cursor.fetchall() if " Scan " in row[0])
    recent = [name for name, bound in partitions.items() if "DEFAULT" not in bound and _upper(bound) > _days_ago(3)]
    assert "timeouts_task_default" in plan  # which no bound prunes
    assert recent and not [name for name in recent if re.search(rf"\b{name}\b", plan)], plan


def _upper(bound):
    return datetime.fromisoformat(re.search(r"TO \('([^']+)'\)", bound).group(1))


def _days_ago(days):
    return datetime.now(UTC) - timedelta(days=days)


# --- Who sweeps -------------------------------------------------------------------------------------------

def test_a_sweeper_sweeps_every_interval_and_again_soon_after_a_full_sweep():
    timeouts.set_limits("test.record", max_lateness=FIVE_S, on_late="skip")
    for n in range(3):
        scheduled(biz_id=n, ago=30)
    now = [100.0]
    sweeper = Sweeper(clock=lambda: now[0], interval=1.0, limit=2)
    assert not sweeper.due(100.0)  # told nothing yet
    sweeper.note(oldest=80.0, min_lateness=None)
    assert not sweeper.due(100.0)  # no policy ends tasks
    sweeper.note(oldest=99.0, min_lateness=5.0)
    assert not sweeper.due(100.0) and sweeper.wake_at == 104.0  # the oldest task is not that late yet
    sweeper.note(oldest=70.0, min_lateness=5.0)
    assert sweeper.due(100.0) and sweeper.sweep() == 2
    assert sweeper.next_at == 100.0 + late_sweep.SWEEP_AGAIN
    assert sweeper.sweep() == 1 and sweeper.next_at == 101.0
    assert not sweeper.due(100.5) and sweeper.due(101.0)


def test_the_dispatcher_ends_late_tasks_in_its_loop_without_claiming_them(broker):
    timeouts.set_limits("test.record", max_lateness=FIVE_S, on_late="skip")
    late = [scheduled(biz_id=n, ago=30) for n in range(3)]
    stop = threading.Event()
    dispatcher = Dispatcher(stop=stop)
    thread = threading.Thread(target=dispatcher.run, daemon=True)
    thread.start()
    try:
        assert dispatcher.stats.wait_for(lambda s: s.ended_late >= 3, 20)
    finally:
        stop.set()
        thread.join(20)
    assert not thread.is_alive()
    assert [reload(task).status for task in late] == [Status.CANCELLED] * 3
    assert dispatcher.stats.claimed == 0


def test_the_scan_ends_late_tasks_before_it_claims(broker):
    timeouts.set_limits("test.record", max_lateness=FIVE_S, on_late="skip")
    late, on_time = scheduled(biz_id="late", ago=30), scheduled(biz_id="on time", ago=1)
    assert scan() == 1
    assert (reload(late).status, reload(on_time).status) == (Status.CANCELLED, Status.DISPATCHED)
