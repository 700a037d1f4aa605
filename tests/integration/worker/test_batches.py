"""Tasks due together travel in one `timeouts.run_batch` message (RUN_BATCH_SIZE): how they are
grouped and published, and that each task of a batch is still fenced, never early, run once, and
not held behind a slow handler."""

from datetime import UTC, datetime, timedelta

import pytest
from celery.utils.saferepr import saferepr
from django.db import connection
from django.test.utils import CaptureQueriesContext

import timeouts
from tests.support.broker_messages import message_etas, message_priorities, queued_messages, shown_arguments
from timeouts import registry
from timeouts import tasks as timeouts_tasks
from timeouts.dispatch.claiming import claim_due
from timeouts.dispatch.publishing import ETA_HEADROOM, publish
from timeouts.models import TimeoutTask
from timeouts.store import queries
from timeouts.testing import faults
from timeouts.worker import attempt, batches, running
from timeouts.worker import priority as on_time_first

Status = TimeoutTask.Status
pytestmark = pytest.mark.django_db(transaction=True)


def schedule_due(biz_type, n, ago=5, **extra):
    """n tasks due `ago` seconds ago, a millisecond apart, oldest first (keys may repeat across calls)."""
    now = datetime.now(UTC)
    return [TimeoutTask.objects.schedule(biz_type, f"{biz_type}-{i}", at=now - timedelta(seconds=ago) + timedelta(
        milliseconds=i), on_conflict=None, **extra) for i in range(n)]


def items(claims):
    return [claim.batch_item() for claim in claims]


def test_tasks_due_together_are_published_in_batches_of_one_queue(broker, settings):
    settings.TIMEOUTS = {**settings.TIMEOUTS, "RUN_BATCH_SIZE": 20}
    broker.flushdb()
    recorded = schedule_due("test.record", 45)
    # Each group due clearly after the one before, however fast they are scheduled: the messages'
    # order follows the claims' (run_at) order.
    slow = schedule_due("test.slow", 2, ago=4)  # ttr=3: a batch of its own
    queued = schedule_due("test.queued", 3, ago=3)
    assert publish(claim_due(100)) == 50
    default = queued_messages(broker, "celery")
    # The time limit: the TTR (60 by default) plus the budget within which a batch starts its tasks.
    assert default == [
        ("timeouts.run_batch", [t.job_id for t in recorded[:20]], 61),
        ("timeouts.run_batch", [t.job_id for t in recorded[20:40]], 61),
        ("timeouts.run_batch", [t.job_id for t in recorded[40:]], 61),
        ("timeouts.run_batch", [t.job_id for t in slow], 4),
    ]
    assert queued_messages(broker, "timeouts-test-other") == [("timeouts.run_batch", [t.job_id for t in queued], 61)]

    broker.flushdb()
    [alone] = schedule_due("test.record", 1)
    publish(claim_due(100))
    assert queued_messages(broker, "celery") == [("timeouts.run", [alone.job_id], 60)]
    broker.flushdb()


def test_a_backlog_s_messages_go_after_those_claimed_on_time(broker):
    """Due longer ago than BACKLOG_AFTER when claimed: at the lowest priority, which a worker takes
    after every message of a higher one, whatever their order in the broker."""
    broker.flushdb()
    backlog = schedule_due("test.record", 3, ago=5)
    publish(claim_due(100))
    on_time = schedule_due("test.slow", 2, ago=0)
    publish(claim_due(100))
    assert queued_messages(broker, "celery") == [
        ("timeouts.run_batch", [t.job_id for t in on_time], 4),
        ("timeouts.run_batch", [t.job_id for t in backlog], 61),
    ]
    assert message_priorities(broker, "celery") == [0, 9]
    broker.flushdb()


def test_a_task_claimed_on_time_never_travels_in_a_backlog_s_message(broker):
    """Claimed together with a backlog of its own queue and TTR, it still goes in a message of its
    own: in the backlog's, it would wait at the backlog's priority."""
    broker.flushdb()
    backlog = schedule_due("test.record", 3, ago=5)
    [on_time] = schedule_due("test.fail", 1, ago=0)  # the same queue and TTR as test.record
    publish(claim_due(100))
    assert queued_messages(broker, "celery") == [
        ("timeouts.run", [on_time.job_id], 60),
        ("timeouts.run_batch", [t.job_id for t in backlog], 61),
    ]
    assert message_priorities(broker, "celery") == [0, 9]
    broker.flushdb()


def test_tasks_claimed_ahead_share_a_message_only_when_due_within_the_batch_window(broker):
    """A worker process waits inside a batch until each task is due: tasks due apart get messages
    (and Celery ETAs) of their own, so any free process can take them. A task claimed ahead goes as
    a batch even alone, since a batch's items carry their run_at: its message is due ETA_HEADROOM
    early, and the worker process waits out the rest itself."""
    broker.flushdb()
    at = datetime.now(UTC) + timedelta(seconds=2)
    together = [TimeoutTask.objects.schedule("test.record", i, at=at) for i in range(3)]
    apart = [TimeoutTask.objects.schedule("test.record", i, at=at + timedelta(milliseconds=50 * (i + 1)),
                                          on_conflict=None) for i in range(2)]
    publish(claim_due(10, lead=5))
    assert [(name, sorted(ids)) for name, ids, _ in queued_messages(broker, "celery")] == [
        ("timeouts.run_batch", sorted(t.job_id for t in together)),
        ("timeouts.run_batch", [apart[0].job_id]),
        ("timeouts.run_batch", [apart[1].job_id]),
    ]
    assert message_etas(broker) == [task.run_at - ETA_HEADROOM for task in (together[0], *apart)]
    broker.flushdb()


def test_tasks_claimed_ahead_beside_a_backlog_share_a_message_only_within_a_narrower_window(broker):
    """Beside a backlog every process is busy, and tasks sharing a message run one after another at
    a loaded server's pace: tasks due 5 ms apart get messages of their own, as they would not alone."""
    broker.flushdb()
    at = datetime.now(UTC) + timedelta(seconds=2)
    pair = [TimeoutTask.objects.schedule("test.record", i, at=at + timedelta(milliseconds=5 * i)) for i in range(2)]
    publish(claim_due(10, lead=5))
    assert [ids for _, ids, _ in queued_messages(broker, "celery")] == [[t.job_id for t in pair]]
    broker.flushdb()

    backlog = schedule_due("test.record", 3, ago=5)
    pair = [TimeoutTask.objects.schedule("test.record", f"beside-{i}", at=at + timedelta(milliseconds=5 * i))
            for i in range(2)]
    publish(claim_due(10, lead=5))
    assert [ids for _, ids, _ in queued_messages(broker, "celery")] == [
        [pair[0].job_id], [pair[1].job_id], [t.job_id for t in backlog]]
    broker.flushdb()


def test_messages_show_their_arguments_as_celery_would(broker, settings):
    """Publishing hands Celery the arguments' repr() (its own saferepr costs ten times as much): logs,
    events and Flower still show the arguments, cut at Celery's limit."""
    from timeouts.tasks import run

    settings.TIMEOUTS = {**settings.TIMEOUTS, "RUN_BATCH_SIZE": 20}
    broker.flushdb()
    schedule_due("test.record", 21)
    publish(claim_due(100))
    batch, alone = shown_arguments(broker)  # 20 tasks in a batch, then one alone
    limit = run.app.amqp.argsrepr_maxsize
    assert len(repr(batch[2])) > limit
    assert batch[:2] == (repr(batch[2])[:limit - 3] + "...", "{}")
    assert alone[:2] == (repr(alone[2]), "{}") and alone[0] == saferepr(alone[2])
    broker.flushdb()


def test_a_batch_size_of_one_sends_every_task_alone(broker, settings):
    settings.TIMEOUTS = {**settings.TIMEOUTS, "RUN_BATCH_SIZE": 1}
    broker.flushdb()
    schedule_due("test.record", 3)
    publish(claim_due(100))
    assert [name for name, _, _ in queued_messages(broker, "celery")] == ["timeouts.run"] * 3
    broker.flushdb()


def test_a_batch_runs_each_task_once_and_a_cancelled_or_stale_one_not_at_all(starts):
    tasks = schedule_due("test.record", 5)
    batch = items(claim_due(10))
    assert tasks[1].cancel() is True
    batch[3][2] += 1  # a stale message: not the attempt that was dispatched
    assert batches.run_batch(batch) == "3 done, 2 dropped"
    assert sorted(job_id for job_id, *_ in starts.all()) == sorted(t.job_id for t in (tasks[0], tasks[2], tasks[4]))
    statuses = [TimeoutTask.objects.get(pk=t.pk).status for t in tasks]
    assert statuses == [Status.DONE, Status.CANCELLED, Status.DONE, Status.DISPATCHED, Status.DONE]


def test_a_batch_writes_each_done_with_the_next_start_in_one_statement(starts):
    tasks = schedule_due("test.record", 3)
    with CaptureQueriesContext(connection) as captured:
        assert batches.run_batch(items(claim_due(10))) == "3 done"
    names = [name for q in captured for name in ("finish_then_start_task", "start_task", "finish_task")
             if q["sql"].lstrip().startswith(queries.QUERIES[name].split("\n", 1)[0])]
    assert names == ["start_task", "finish_then_start_task", "finish_then_start_task", "finish_task"]
    rows = [TimeoutTask.objects.get(pk=t.pk) for t in tasks]
    assert [row.status for row in rows] == [Status.DONE] * 3
    # One statement, one clock reading: each DONE at the instant the next task started.
    assert [row.finished_at for row in rows[:2]] == [row.started_at for row in rows[1:]]
    assert starts.count() == 3


def test_the_merged_statement_leaves_the_rows_as_the_start_and_the_done_alone_do(starts):
    alone, merged = schedule_due("test.record", 2), schedule_due("test.record", 2, ago=4)
    claims = {claim.job_id: claim for claim in claim_due(10)}
    for task in alone:
        assert running.run(claims[task.job_id].fence) == "done"
    assert batches.run_batch([claims[t.job_id].batch_item() for t in merged]) == "2 done"
    times = {"action_time", "run_at", "created_at", "modified_at", "dispatched_at", "started_at", "finished_at",
             "job_id", "biz_id"}

    def state(task):
        row = TimeoutTask.objects.filter(pk=task.pk).values().get()
        return {column: value for column, value in row.items() if column not in times}

    assert [state(t) for t in merged] == [state(t) for t in alone]


def test_tasks_of_a_batch_on_different_partitions_write_the_done_and_the_start_apart(starts):
    tasks = schedule_due("test.record", 2)
    batch = items(claim_due(10))
    batch[1][4] = None  # a message from before messages named partitions: through the parent
    with CaptureQueriesContext(connection) as captured:
        assert batches.run_batch(batch) == "2 done"
    assert not [q for q in captured if "finish_then_start_task" in q["sql"] or "WITH c AS" in q["sql"]]
    assert [TimeoutTask.objects.get(pk=t.pk).status for t in tasks] == [Status.DONE] * 2


def test_a_batch_whose_next_task_was_cancelled_still_records_the_done_before_it(starts):
    tasks = schedule_due("test.record", 2)
    batch = items(claim_due(10))
    assert tasks[1].cancel() is True
    assert batches.run_batch(batch) == "1 done, 1 dropped"
    assert [TimeoutTask.objects.get(pk=t.pk).status for t in tasks] == [Status.DONE, Status.CANCELLED]
    assert starts.count() == 1


def test_a_done_whose_lease_ran_out_meanwhile_is_reported_lost_and_the_next_task_still_runs(starts):
    """The handler outlived its lease: recovery (here the handler itself, as recovery would) put
    the task back to PENDING, so the DONE written with the next start matches nothing. It is
    tried once more alone, matches nothing again, and the next task runs all the same."""

    def outlives_its_lease(task):
        TimeoutTask.objects.filter(pk=task.pk).update(status=Status.PENDING, lease_until=None)

    timeouts.handler("test.lease_lost")(outlives_its_lease)
    try:
        first = schedule_due("test.lease_lost", 1)[0]
        second = schedule_due("test.record", 1, ago=4)[0]
        assert batches.run_batch(items(claim_due(10))) == "1 done, 1 lost"
        assert TimeoutTask.objects.get(pk=first.pk).status == Status.PENDING
        assert TimeoutTask.objects.get(pk=second.pk).status == Status.DONE
        assert starts.count() == 1
    finally:
        registry.unregister("test.lease_lost")


def test_a_batch_claimed_ahead_starts_each_task_at_its_own_time_never_before(starts):
    now = datetime.now(UTC)
    tasks = [TimeoutTask.objects.schedule("test.record", i, at=now + timedelta(milliseconds=300 + 100 * i))
             for i in range(3)]
    claims = claim_due(10, lead=5)
    assert len(claims) == 3
    batches.run_batch(items(claims))
    rows = {job_id: (action_time, started_at) for job_id, _, action_time, started_at in starts.all()}
    assert set(rows) == {t.job_id for t in tasks}
    for action_time, started_at in rows.values():
        assert timedelta(0) <= started_at - action_time < timedelta(seconds=1)


def test_a_batch_waiting_briefly_for_its_next_task_writes_the_done_with_its_start(starts, monkeypatch):
    """A wait shorter than DONE_WAITS_UP_TO leaves the last DONE to the next start's statement; a
    longer one writes it first."""
    monkeypatch.setattr(batches, "DONE_WAITS_UP_TO", 0.1)
    now = datetime.now(UTC)
    tasks = [TimeoutTask.objects.schedule("test.record", i, at=now + timedelta(milliseconds=300 + offset))
             for i, offset in enumerate((0, 40, 440))]
    claims = claim_due(10, lead=5)
    with CaptureQueriesContext(connection) as captured:
        assert batches.run_batch(items(claims)) == "3 done"
    names = [name for q in captured for name in ("finish_then_start_task", "start_task", "finish_task")
             if q["sql"].lstrip().startswith(queries.QUERIES[name].split("\n", 1)[0])]
    assert names == ["start_task", "finish_then_start_task", "finish_task", "start_task", "finish_task"]
    assert [TimeoutTask.objects.get(pk=t.pk).status for t in tasks] == [Status.DONE] * 3


def test_a_batch_behind_a_slow_handler_gives_its_unstarted_tasks_back(starts, monkeypatch):
    monkeypatch.setattr(batches, "BUDGET", 0.2)
    first = schedule_due("test.slow", 1, attribute={"sleep": 0.4})
    rest = schedule_due("test.record", 4)
    batch = items(claim_due(10))
    assert batches.run_batch(batch) == "1 done, 4 released"
    assert starts.count() == 1
    assert TimeoutTask.objects.get(pk=first[0].pk).status == Status.DONE
    for task in rest:
        task.refresh_from_db()
        assert (task.status, task.attempts) == (Status.PENDING, 0)
    assert len(claim_due(10)) == 4  # due, and claimable at once: no lease to wait out


def test_a_backlog_s_batch_that_gives_way_passes_its_unstarted_tasks_on_still_claimed(broker, starts, monkeypatch):
    """Asked to give way to a task claimed on time, the batch ends after its current task and
    publishes the rest as a message of their own, without a statement: they stay claimed, and
    that message runs each of them once."""
    broker.flushdb()
    tasks = schedule_due("test.record", 4)
    asks = iter([True])
    monkeypatch.setattr(on_time_first, "should_give_way", lambda: next(asks, False))
    give_way = on_time_first.GiveWay(timeouts_tasks.run_batch, "default")
    assert batches.run_batch(items(claim_due(10)), give_way) == "1 done, 3 passed on"
    rest = [t.job_id for t in tasks[1:]]
    assert TimeoutTask.objects.filter(job_id__in=rest, status=Status.DISPATCHED).count() == 3
    [(name, job_ids, _)] = queued_messages(broker, "celery")
    assert (name, job_ids) == ("timeouts.run_batch", rest)
    [(_, _, [passed_on])] = shown_arguments(broker, "celery")
    assert batches.run_batch(passed_on) == "3 done"
    assert starts.count() == 4
    broker.flushdb()


def test_a_batch_that_cannot_pass_its_tasks_on_gives_them_back(starts, monkeypatch):
    tasks = schedule_due("test.record", 4)

    class BrokerDown:
        def asked(self):
            return True

        def pass_on(self, items):
            raise ConnectionError("the broker is down")

    assert batches.run_batch(items(claim_due(10)), BrokerDown()) == "1 done, 3 released"
    for task in tasks[1:]:
        task.refresh_from_db()
        assert (task.status, task.attempts, task.lease_until) == (Status.PENDING, 0, None)


def test_a_batch_that_fails_part_way_gives_its_unstarted_tasks_back_at_once(starts, monkeypatch):
    """An error the batch cannot handle (here a fault after the first handler, before its DONE,
    which a batch writes with the second task's start) fails the message, which is then
    acknowledged: the first task's DONE is still written, and the tasks it had not started go back to
    PENDING at once instead of waiting out their claim's lease."""
    monkeypatch.setattr(faults, "ARMED", faults.parse("run.before_done=raise#1"))
    tasks = schedule_due("test.record", 4)
    with pytest.raises(faults.FaultInjected):
        batches.run_batch(items(claim_due(10)))
    assert TimeoutTask.objects.get(pk=tasks[0].pk).status == Status.DONE
    for task in tasks[1:]:
        task.refresh_from_db()
        assert (task.status, task.attempts, task.lease_until) == (Status.PENDING, 0, None)
    assert starts.count() == 1


def test_a_start_in_a_batch_leases_the_task_until_the_batch_time_limit():
    """The TTR plus what is left of the batch's budget: as long as Celery lets the batch run."""
    [task] = schedule_due("test.record", 1)
    [claim] = claim_due(10)
    started = attempt.start({"job_id": claim.job_id, "action_time": claim.action_time}, claim.attempt, 0.75)
    assert (started.lease_until - started.started_at).total_seconds() == pytest.approx(task.ttr + 0.75)
