"""The order in which a prefork worker hands requests to its busy pool: those of timeouts' claimed
on time (with an ETA) first, in their own order, then the rest as Celery queued them; and the ask
for one backlog batch to give way while such a request waits."""

import time
from datetime import UTC, datetime
from types import SimpleNamespace

from kombu.asynchronous.semaphore import LaxBoundedSemaphore

from timeouts import on_time_first
from timeouts.publishing import RUN, RUN_BATCH

ETA = datetime(2026, 1, 1, tzinfo=UTC)


class Worker:
    """What Celery's WorkController gives the step: its semaphore, and the pool's intake."""

    def __init__(self, processes):
        self.semaphore = LaxBoundedSemaphore(processes)
        self._quick_acquire = self.semaphore.acquire
        self.handed = []
        on_time_first._install(sender=self)

    def _process_task(self, request):
        self.handed.append(request.label)

    def offer(self, label, name=RUN_BATCH, eta=None):
        self._process_task_sem(SimpleNamespace(label=label, name=name, eta=eta))

    def one_process_frees(self):
        self.semaphore.release()


def test_requests_claimed_on_time_pass_those_claimed_late_in_their_own_order():
    worker = Worker(processes=1)
    worker.offer("late 1")
    worker.offer("late 2")
    worker.offer("late 3")
    worker.offer("on time 1", eta=ETA)
    worker.offer("on time 2", name=RUN, eta=ETA)
    assert worker.handed == ["late 1"]
    for _ in range(4):
        worker.one_process_frees()
    assert worker.handed == ["late 1", "on time 1", "on time 2", "late 2", "late 3"]


def test_one_batch_gives_way_for_each_request_claimed_on_time_that_waits():
    worker = Worker(processes=2)
    worker.offer("late 1")
    worker.offer("late 2")
    assert not on_time_first.should_give_way()
    worker.offer("on time 1", eta=ETA)
    worker.offer("on time 2", eta=ETA)
    assert on_time_first.should_give_way()
    assert on_time_first.should_give_way()
    assert not on_time_first.should_give_way()  # asked twice, answered twice
    worker.one_process_frees()
    worker.one_process_frees()
    assert worker.handed == ["late 1", "late 2", "on time 1", "on time 2"]
    assert not on_time_first.should_give_way()


def test_an_ask_is_withdrawn_when_a_process_frees_without_giving_way():
    worker = Worker(processes=1)
    worker.offer("late 1")
    worker.offer("on time 1", eta=ETA)
    worker.offer("on time 2", eta=ETA)
    worker.one_process_frees()  # the batch ended by itself
    assert worker.handed == ["late 1", "on time 1"]
    assert on_time_first.should_give_way()  # for the second, which still waits
    assert not on_time_first.should_give_way()


def test_a_free_process_takes_a_request_claimed_on_time_without_asking_anyone_to_give_way():
    worker = Worker(processes=2)
    worker.offer("late 1")
    worker.offer("on time 1", eta=ETA)
    assert worker.handed == ["late 1", "on time 1"] and not on_time_first.should_give_way()


def test_other_tasks_with_an_eta_keep_their_place():
    worker = Worker(processes=1)
    worker.offer("late 1")
    worker.offer("late 2")
    worker.offer("a host's own eta task", name="orders.close", eta=ETA)
    worker.one_process_frees()
    worker.one_process_frees()
    assert worker.handed == ["late 1", "late 2", "a host's own eta task"]
    assert not on_time_first.should_give_way()


def test_an_ask_nobody_answers_runs_out(monkeypatch):
    monkeypatch.setattr(on_time_first, "ASK_LIFETIME", 0.05)
    worker = Worker(processes=1)
    worker.offer("late 1")
    worker.offer("on time 1", eta=ETA)
    worker.semaphore.clear()  # as Celery does with its queued requests when the broker connection is lost
    time.sleep(0.1)
    assert not on_time_first.should_give_way()
