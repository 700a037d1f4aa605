"""The task state machine, driven by Hypothesis through every public move and every worker step, against
a pure Python model of statuses and attempts (the model is the spec: the documented states and moves).

Moves: schedule (with on_conflict, "debounce" too), cancel (a fresh or a stale instance, and by key), reschedule (to the
past, now, an hour, days and years ahead: across partitions and into DEFAULT), requeue, claim_due (with a
lead), the worker's compare-and-set and its finish/fail (attempt.start, the finish_task/fail_task SQL),
a whole running.run of a message (also stale and duplicate ones), and lease expiry + recover_expired().
After every step the table must equal the model, and the invariants below must hold.

Times are either due (in the past, or now) or at least an hour away, and a failed attempt's backoff is 0,
so whether a task is due never depends on how fast the machine runs.
"""

from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from timeouts import TaskConflict
from timeouts.conf import get_settings, notify_params
from timeouts.dispatch.claiming import claim_due
from timeouts.models import TimeoutTask
from timeouts.protocol import Fence
from timeouts.registry import get_handler
from timeouts.store.queries import fetch_one
from timeouts.store.recovery import recover_expired
from timeouts.worker import attempt, running

Status = TimeoutTask.Status
PENDING, DISPATCHED, DONE, CANCELLED, RUNNING, DEAD = (
    Status.PENDING, Status.DISPATCHED, Status.DONE, Status.CANCELLED, Status.RUNNING, Status.DEAD)
STATUS = {status: status.name for status in Status}
WAITING = (PENDING, DISPATCHED)  # not started: may be rescheduled, is what on_conflict looks at
# cancel() -> True: this call made sure the handler never runs (again). A DEAD task is discarded (README).
CANCELLABLE = (PENDING, DISPATCHED, DEAD)
# The handlers of tests/testapp/timeouts_handlers.py: test.fail raises, with max_attempts=2.
MAX_ATTEMPTS = {name: get_handler(name).max_attempts or get_settings().DEFAULT_MAX_ATTEMPTS
                for name in ("test.record", "test.fail")}
WHEN = {  # name: (schedule()/reschedule() arguments relative to the machine's start, due?)
    "3 days ago": (lambda t0: {"at": t0 - timedelta(days=3)}, True),
    "an hour ago": (lambda t0: {"at": t0 - timedelta(hours=1)}, True),
    "now": (lambda t0: {"delay": 0}, True),
    "in an hour": (lambda t0: {"delay": 3600}, False),
    "in 3 days": (lambda t0: {"delay": timedelta(days=3)}, False),  # another daily partition
    "in 2100": (lambda t0: {"at": datetime(2100, 1, 1, tzinfo=UTC)}, False),  # beyond them: DEFAULT
}
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(240)]
SEEN = Counter()  # what the runs reached, so the test can tell it explored the interesting states


@dataclass
class Task:
    """The model of one task."""

    job_id: int
    key: tuple
    max_attempts: int
    action_time: datetime  # as stored: a message addresses the row by (job_id, action_time)
    first_action_time: datetime  # for stale instances
    due: bool
    status: int = PENDING
    attempts: int = 0
    failures: int = 0  # failed attempts (raised, or lease lost while running) since (re)queued
    cancelled: bool = False  # a cancel returned True for it since it was last (re)queued
    done: bool = False  # DONE once: DONE is final


@dataclass(frozen=True)
class Message:  # a published timeouts.run message
    job_id: int
    action_time: datetime
    attempt: int


@dataclass(frozen=True)
class Run:  # a handler that started and has not reported yet
    job_id: int
    action_time: datetime
    attempt: int


def has_due_tasks(machine):
    return any(t.status == PENDING and t.due for t in machine.model.values())


def has_leases(machine):
    return any(t.status in (DISPATCHED, RUNNING) for t in machine.model.values())


def sql(statement, params=()):
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else None


class TaskMachine(RuleBasedStateMachine):
    tasks = Bundle("tasks")
    messages = Bundle("messages")
    runs = Bundle("runs")

    @initialize()
    def empty_table(self):
        sql("DELETE FROM timeouts_task")
        self.t0 = sql("SELECT clock_timestamp()")[0][0]
        self.model: dict[int, Task] = {}

    def handle(self, job_id, stale=False):
        """A TimeoutTask instance as a caller would hold it: current, or stale (its first action_time)."""
        task = self.model[job_id]
        instance = TimeoutTask(job_id=job_id, action_time=task.first_action_time if stale else task.action_time)
        instance._state.adding, instance._state.db = False, "default"
        return instance

    def of_key(self, key, statuses):
        return [t for t in self.model.values() if t.key == key and t.status in statuses]

    def mark_cancelled(self, task):
        task.status, task.cancelled = CANCELLED, True

    # -- the public API ------------------------------------------------------------------------------

    @precondition(lambda machine: len(machine.model) < 6)  # a handful of tasks
    @rule(target=tasks, biz_type=st.sampled_from(sorted(MAX_ATTEMPTS)), biz_id=st.sampled_from([1, 2]),
          when=st.sampled_from(["now", "now", "an hour ago", *sorted(WHEN)]),
          on_conflict=st.sampled_from([None, None, "error", "keep", "replace"]))
    def schedule(self, biz_type, biz_id, when, on_conflict):
        key = (biz_type, str(biz_id))
        waiting = sorted(self.of_key(key, WAITING), key=lambda t: (t.action_time, t.job_id))
        arguments, due = WHEN[when]
        try:
            created = TimeoutTask.objects.schedule(biz_type, biz_id, on_conflict=on_conflict, **arguments(self.t0))
        except TaskConflict:
            assert on_conflict == "error" and waiting
            SEEN["schedule: conflict"] += 1
            return multiple()
        assert not (on_conflict == "error" and waiting)
        if on_conflict == "keep" and waiting:
            assert created.job_id == waiting[0].job_id
            SEEN["schedule: kept"] += 1
            return multiple()
        if on_conflict == "replace":
            for task in waiting:
                self.mark_cancelled(task)
                SEEN["schedule: replaced"] += 1
        assert created.job_id not in self.model
        self.model[created.job_id] = Task(created.job_id, key, MAX_ATTEMPTS[biz_type], created.action_time,
                                          created.action_time, due)
        return created.job_id

    @precondition(lambda machine: len(machine.model) < 6)
    @rule(target=tasks, biz_type=st.sampled_from(sorted(MAX_ATTEMPTS)), biz_id=st.sampled_from([1, 2]),
          when=st.sampled_from(sorted(WHEN)))
    def debounce(self, biz_type, biz_id, when):
        """on_conflict="debounce": the key's first PENDING task moves (a retry's too), else a new one."""
        key = (biz_type, str(biz_id))
        pending = sorted(self.of_key(key, (PENDING,)), key=lambda t: t.job_id)  # job ids grow as tasks are created
        arguments, due = WHEN[when]
        task = TimeoutTask.objects.schedule(biz_type, biz_id, on_conflict="debounce", **arguments(self.t0))
        if pending:
            assert task.job_id == pending[0].job_id
            pending[0].action_time, pending[0].due = task.action_time, due
            SEEN["debounce: moved"] += 1
            return multiple()
        assert task.job_id not in self.model
        self.model[task.job_id] = Task(task.job_id, key, MAX_ATTEMPTS[biz_type], task.action_time, task.action_time,
                                       due)
        SEEN["debounce: created"] += 1
        return task.job_id

    @rule(job_id=tasks, stale=st.booleans())
    def cancel(self, job_id, stale):
        task = self.model[job_id]
        expected = task.status in CANCELLABLE
        SEEN[f"cancel {'stale ' * stale}{'' if expected else 'refused '}{STATUS[task.status]}"] += 1
        assert self.handle(job_id, stale).cancel() is expected
        if expected:
            self.mark_cancelled(task)

    @rule(biz_type=st.sampled_from(sorted(MAX_ATTEMPTS)), biz_id=st.sampled_from([1, "1", 2]))
    def cancel_by_key(self, biz_type, biz_id):
        expected = self.of_key((biz_type, str(biz_id)), CANCELLABLE)
        assert TimeoutTask.objects.cancel(biz_type, biz_id) == len(expected)
        for task in expected:
            self.mark_cancelled(task)

    @rule(job_id=tasks, when=st.sampled_from(sorted(WHEN)), stale=st.booleans())
    def reschedule(self, job_id, when, stale):
        task = self.model[job_id]
        arguments, due = WHEN[when]
        instance = self.handle(job_id, stale)
        expected = task.status in WAITING
        SEEN[f"reschedule {'stale ' * stale}{'' if expected else 'refused '}{STATUS[task.status]}"] += 1
        assert instance.reschedule(**arguments(self.t0)) is expected
        if expected:
            task.status, task.due, task.action_time = PENDING, due, instance.action_time

    @rule(job_id=tasks, stale=st.booleans())
    def requeue(self, job_id, stale):
        task = self.model[job_id]
        instance = self.handle(job_id, stale)
        expected = task.status in (CANCELLED, DEAD)
        SEEN[f"requeue {'' if expected else 'refused '}{STATUS[task.status]}"] += 1
        assert instance.requeue() is expected
        if expected:
            task.status, task.attempts, task.failures, task.cancelled, task.due = PENDING, 0, 0, False, True
            task.action_time = instance.action_time

    # -- claiming and the worker --------------------------------------------------------------------------

    @precondition(has_due_tasks)
    @rule(target=messages, limit=st.integers(min_value=1, max_value=4), lead=st.sampled_from([0.0, 0.1, 5.0]))
    def claim(self, limit, lead):
        claimable = {t.job_id for t in self.model.values() if t.status == PENDING and t.due}
        claims = claim_due(limit, lead=lead)
        claimed = {c.job_id for c in claims}
        assert len(claims) == len(claimed) == min(limit, len(claimable)) and claimed <= claimable, (claims, claimable)
        if claimable - claimed:  # shared fairly among the biz_types, and the oldest of each first
            rows = sql("SELECT job_id, biz_type, run_at FROM timeouts_task WHERE job_id = ANY(%s)", [list(claimable)])
            by_type = {}
            for job_id, biz_type, run_at in rows:
                by_type.setdefault(biz_type, []).append((run_at, job_id in claimed))
            share = limit // len(by_type)
            for biz_type, tasks in by_type.items():
                taken = [run_at for run_at, was_claimed in tasks if was_claimed]
                left = [run_at for run_at, was_claimed in tasks if not was_claimed]
                if taken and left:
                    assert max(taken) <= min(left), (biz_type, tasks)
                if left:
                    assert len(taken) >= share, (biz_type, share, by_type)
        for claim in claims:
            task = self.model[claim.job_id]
            assert (claim.action_time, claim.attempt) == (task.action_time, task.attempts + 1)
            task.status = DISPATCHED
        SEEN[f"claimed {len(claims)}"] += 1
        return multiple(*(Message(c.job_id, c.action_time, c.attempt) for c in claims))

    def would_start(self, message):
        task = self.model[message.job_id]
        return (task.status, task.attempts, task.action_time) == (DISPATCHED, message.attempt - 1, message.action_time)

    def started(self, message):
        task = self.model[message.job_id]
        assert not task.cancelled, "a task whose cancel() returned True started"
        task.status, task.attempts = RUNNING, task.attempts + 1

    @rule(target=runs, message=messages)
    def start(self, message):
        """The worker's compare-and-set for a (possibly stale or duplicate) message."""
        expected = self.would_start(message)
        key = {"job_id": message.job_id, "action_time": message.action_time}
        task = attempt.start(key, message.attempt)
        assert (task is not None) is expected, (message, self.model[message.job_id])
        SEEN["start" if expected else "start: stale message dropped"] += 1
        if not expected:
            return multiple()
        self.started(message)
        assert (task.status, task.attempts) == (RUNNING, message.attempt)
        return Run(message.job_id, message.action_time, message.attempt)

    def reporting(self, run):
        task = self.model[run.job_id]
        return (task.status, task.attempts, task.action_time) == (RUNNING, run.attempt, run.action_time)

    @rule(run=runs)
    def finish(self, run):
        expected = self.reporting(run)
        row = fetch_one("finish_task", {"job_id": run.job_id, "action_time": run.action_time, "attempt": run.attempt})
        assert (row is not None) is expected  # None: the lease ran out and the task moved on ("lost")
        SEEN["finish" if expected else "finish: lost"] += 1
        if expected:
            task = self.model[run.job_id]
            task.status, task.done = DONE, True

    @rule(run=runs)
    def fail(self, run):
        expected = self.reporting(run)
        params = {"job_id": run.job_id, "action_time": run.action_time, "attempt": run.attempt,
                  "error": "failed in the model test", "backoff": 0.0, **notify_params()}
        row = fetch_one("fail_task", params)
        assert (row is not None) is expected
        SEEN["fail" if expected else "fail: lost"] += 1
        if expected:
            self.failed(self.model[run.job_id])
            assert row["status"] == self.model[run.job_id].status

    def failed(self, task):
        task.failures += 1
        task.status = DEAD if task.attempts >= task.max_attempts else PENDING
        SEEN[f"failed -> {STATUS[task.status]}"] += 1
        task.due = True  # backoff 0 here; recovery keeps the run_at it was claimed at

    @rule(message=messages)
    def run_message(self, message):
        """What a Celery worker does with a message: start, run the handler, finish or fail."""
        task = self.model[message.job_id]
        expected = self.would_start(message)
        if expected and task.key[0] == "test.fail" and message.attempt < task.max_attempts:
            return  # a retry's backoff would make the task due only in 1-2 s: not modelled here
        outcome = running.run(Fence(message.job_id, message.action_time, message.attempt))
        SEEN[f"run: {outcome}"] += 1
        if not expected:
            assert outcome == "dropped"
            return
        self.started(message)
        if task.key[0] == "test.fail":
            assert outcome == "dead"
            self.failed(task)
        else:
            assert outcome == "done"
            task.status, task.done = DONE, True

    @precondition(has_leases)
    @rule(message=messages)
    def claim_lease_expires(self, message):
        self.lease_expires(message.job_id)

    @precondition(has_leases)
    @rule(run=runs)
    def run_lease_expires(self, run):
        self.lease_expires(run.job_id)

    def lease_expires(self, job_id):
        sql("UPDATE timeouts_task SET lease_until = clock_timestamp() - interval '1 second' "
            "WHERE job_id = %s AND status IN (%s, %s)", [job_id, Status.DISPATCHED, Status.RUNNING])
        task = self.model[job_id]
        assert recover_expired() == (1 if task.status in (DISPATCHED, RUNNING) else 0)
        SEEN[f"lease expired: {STATUS[task.status]}"] += 1
        if task.status == DISPATCHED:
            task.status = PENDING  # never started: no attempt used
        elif task.status == RUNNING:
            self.failed(task)

    # Rules are picked uniformly: these get a second entry so runs reach RUNNING, DONE and DEAD often.
    @precondition(has_due_tasks)
    @rule(target=messages, limit=st.integers(min_value=1, max_value=4))
    def claim_again(self, limit):
        return self.claim(limit, 0.0)

    @rule(target=runs, message=messages)
    def start_again(self, message):
        return self.start(message)

    @rule(run=runs)
    def fail_again(self, run):
        self.fail(run)

    @precondition(has_due_tasks)
    @rule(target=runs, limit=st.integers(min_value=1, max_value=3),
          outcomes=st.lists(st.sampled_from(["finish", "fail", "fail", "keeps running"]), min_size=3, max_size=3))
    def worker_pass(self, limit, outcomes):
        """A worker taking a batch end to end: claim, start each, then finish, fail, or still be running."""
        still_running = []
        for message, outcome in zip(self.claim(limit, 0.0).values, outcomes, strict=False):
            run = self.start(message)
            assert isinstance(run, Run), "a fresh claim's message did not start"
            if outcome == "keeps running":
                still_running.append(run)
            elif outcome == "finish":
                self.finish(run)
            else:
                self.fail(run)
        return multiple(*still_running)

    # -- invariants ------------------------------------------------------------------------------------------

    @invariant()
    def table_equals_model(self):
        rows = sql("SELECT job_id, status, attempts, max_attempts, action_time, run_at <= clock_timestamp(), "
                   "run_at > clock_timestamp() + interval '10 seconds', lease_until IS NOT NULL, "
                   "started_at IS NOT NULL, finished_at IS NOT NULL FROM timeouts_task")
        assert {row[0] for row in rows} == set(self.model)
        for job_id, status, attempts, max_attempts, action_time, is_due, far, leased, started, finished in rows:
            task = self.model[job_id]
            assert (status, attempts, action_time) == (task.status, task.attempts, task.action_time), task
            assert max_attempts == task.max_attempts and 0 <= attempts <= max_attempts
            assert (status == DEAD) <= (attempts == max_attempts == task.failures), "DEAD before max_attempts failures"
            assert task.done <= (status == DONE), "a DONE task changed"
            assert leased == (status in (DISPATCHED, RUNNING)) and finished == (status in (DONE, CANCELLED, DEAD))
            assert started >= (status in (DONE, RUNNING))
            assert (status == CANCELLED) >= task.cancelled
            if status == PENDING:
                assert is_due if task.due else far, task


def test_task_state_machine_against_the_model(starts):
    SEEN.clear()
    run_state_machine_as_test(TaskMachine, settings=settings(
        max_examples=75, stateful_step_count=25, deadline=None, database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    ))
    # Passing proves little unless the runs went through the states that matter.
    for any_of in (("start",), ("start: stale message dropped", "run: dropped"), ("finish", "run: done"),
                   ("failed -> PENDING", "failed -> DEAD"), ("lease expired: RUNNING", "lease expired: DISPATCHED"),
                   ("cancel PENDING", "cancel stale PENDING"), ("schedule: conflict", "schedule: kept"),
                   ("debounce: moved",)):
        assert any(SEEN[outcome] for outcome in any_of), (any_of, sorted(SEEN.items()))
