"""The order in which a prefork worker hands requests to its busy pool: those of timeouts' claimed
on time (with an ETA) first, in the order of their ETAs, then the rest as Celery queued them; the
ask for one backlog batch to give way while such a request waits; and the process asked for ahead
of a request's ETA, held for it."""

import time
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from celery.exceptions import TaskRevokedError
from kombu.asynchronous import Hub
from kombu.asynchronous.semaphore import LaxBoundedSemaphore
from kombu.asynchronous.timer import Timer as WorkersTimer

from timeouts import registry
from timeouts.dispatch.publishing import RUN, RUN_BATCH
from timeouts.worker import priority

ETA = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture(autouse=True)
def no_asks_standing():
    """The asks are the pool's shared memory, made once per process: each test starts with none."""
    yield
    if priority._asks is not None:
        priority._asks[priority.ASKED] = 0
    priority._ahead.clear()


class Worker:
    """What Celery's WorkController gives the step: its semaphore, its pool, and where its consumer
    hands requests (`process_task`), as a prefork worker has them."""

    pool_putlocks = True
    pool_cls = SimpleNamespace(uses_semaphore=True)

    def __init__(self, processes, timer=None):
        self.semaphore = LaxBoundedSemaphore(processes)
        self.timer = Timer() if timer is None else timer
        self.pool = self  # requests run on it: execute_using_pool(pool) records them
        self.process_task = None  # Celery's, which the step replaces
        self.handed = []
        step = priority.OnTimeFirst(self)
        step.create(self)
        if isinstance(self.timer, Timer):
            priority._timed = priority._Timed(clock=self.timer.now)

    def offer(self, label, name=RUN_BATCH, eta=None):
        """The request reaches the pool's intake (at its ETA, if it has one)."""
        self.process_task(request(label, name, eta))

    def receive(self, label, eta, name=RUN_BATCH):
        """The message arrives, ahead of its ETA."""
        priority.received(sender=SimpleNamespace(controller=self, timer=self.timer), request=request(label, name, eta))

    def one_process_frees(self):
        self.semaphore.release()

    def lose_connection(self):
        """What Celery does when the broker connection is lost: it clears its semaphore (the requests
        queued there and the processes held for them are forgotten), then stops the consumer's
        steps before it reconnects."""
        self.semaphore.clear()
        priority.ForgetAsks(parent=None).stop(consumer=None)


class Timer:
    """The worker's timer, on a clock of its own that moves on only when told to."""

    def __init__(self):
        self.clock = 0.0
        self._entries = []

    @property
    def entries(self):
        return [entry for entry in self._entries if not entry.canceled]

    def now(self):
        return self.clock

    def call_after(self, seconds, function, args=()):
        entry = SimpleNamespace(at=self.clock + seconds, function=function, args=args, canceled=False)
        entry.cancel = lambda: setattr(entry, "canceled", True)
        self._entries.append(entry)
        return entry

    def fire(self, limit):
        """`limit` seconds pass: fire the entries due meanwhile, in their order (those set on the way too)."""
        until = self.clock + limit
        while due := sorted((entry for entry in self.entries if entry.at <= until), key=lambda entry: entry.at):
            entry = due[0]
            self._entries.remove(entry)
            self.clock = max(self.clock, entry.at)
            entry.function(*entry.args)
        self.clock = until


def request(label, name, eta):
    def execute_using_pool(pool, **options):
        pool.handed.append(label)

    return SimpleNamespace(id=label, label=label, name=name, eta=eta, execute_using_pool=execute_using_pool)


def soon(seconds=1.0):
    return datetime.now(UTC) + timedelta(seconds=seconds)


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
    assert not priority.should_give_way()
    worker.offer("on time 1", eta=ETA)
    worker.offer("on time 2", eta=ETA)
    assert priority.should_give_way()
    assert priority.should_give_way()
    assert not priority.should_give_way()  # asked twice, answered twice
    worker.one_process_frees()
    worker.one_process_frees()
    assert worker.handed == ["late 1", "late 2", "on time 1", "on time 2"]
    assert not priority.should_give_way()


def test_an_ask_is_withdrawn_when_a_process_frees_without_giving_way():
    worker = Worker(processes=1)
    worker.offer("late 1")
    worker.offer("on time 1", eta=ETA)
    worker.offer("on time 2", eta=ETA)
    worker.one_process_frees()  # the batch ended by itself
    assert worker.handed == ["late 1", "on time 1"]
    assert priority.should_give_way()  # for the second, which still waits
    assert not priority.should_give_way()


def test_a_free_process_takes_a_request_claimed_on_time_without_asking_anyone_to_give_way():
    worker = Worker(processes=2)
    worker.offer("late 1")
    worker.offer("on time 1", eta=ETA)
    assert worker.handed == ["late 1", "on time 1"] and not priority.should_give_way()


def test_other_tasks_with_an_eta_keep_their_place():
    worker = Worker(processes=1)
    worker.offer("late 1")
    worker.offer("late 2")
    worker.offer("a host's own eta task", name="orders.close", eta=ETA)
    worker.one_process_frees()
    worker.one_process_frees()
    assert worker.handed == ["late 1", "late 2", "a host's own eta task"]
    assert not priority.should_give_way()


class KindsRequest(SimpleNamespace):
    """The Request class of a kind's own messages (registry.Kind.request_class)."""


@pytest.fixture
def kind_with_requests():
    kind = registry.register_kind(registry.Kind("test-requests:", "test requests", "the test's own",
                                     request_class=f"{__name__}.KindsRequest"))
    yield kind
    registry.unregister_kind(kind)


def test_a_kinds_own_messages_with_an_eta_pass_a_backlog(kind_with_requests):
    worker = Worker(processes=1)  # its intake reads the kinds' Request classes as it is made
    worker.offer("late 1")
    worker.offer("late 2")
    own = request("a kind's, claimed on time", "orders.close", ETA)
    worker.process_task(KindsRequest(**vars(own)))
    worker.process_task(KindsRequest(**vars(request("a kind's, without an eta", "orders.close", None))))
    for _ in range(3):
        worker.one_process_frees()
    assert worker.handed == ["late 1", "a kind's, claimed on time", "late 2", "a kind's, without an eta"]


def test_an_ask_nobody_answers_runs_out(monkeypatch):
    monkeypatch.setattr(priority, "ASK_LIFETIME", 0.05)
    worker = Worker(processes=1)
    worker.offer("late 1")
    worker.offer("on time 1", eta=ETA)
    worker.lose_connection()  # Celery drops its queued requests
    time.sleep(0.1)
    assert not priority.should_give_way()


def test_a_request_revoked_while_it_waited_gives_its_process_to_the_next():
    def revoked(pool, **options):
        raise TaskRevokedError("revoked")

    worker = Worker(processes=1)
    worker.offer("late 1")
    worker.process_task(SimpleNamespace(id="revoked", name=RUN_BATCH, eta=None, execute_using_pool=revoked))
    worker.offer("late 2")
    worker.one_process_frees()
    assert worker.handed == ["late 1", "late 2"]


def test_requests_claimed_on_time_go_in_the_order_of_their_etas():
    worker = Worker(processes=1)
    worker.offer("late 1")
    worker.offer("on time, due later", eta=ETA + timedelta(milliseconds=5))
    worker.offer("on time, due first", eta=ETA)
    worker.offer("late 2")
    for _ in range(3):
        worker.one_process_frees()
    assert worker.handed == ["late 1", "on time, due first", "on time, due later", "late 2"]


def busy_with_a_backlog():
    """One process, running a backlog's message, with another waiting."""
    worker = Worker(processes=1)
    worker.offer("late 1")
    worker.offer("late 2")
    return worker


def test_a_busy_worker_asks_ahead_of_the_eta_and_holds_the_process_freed_for_the_request():
    worker = busy_with_a_backlog()
    eta = soon()
    worker.receive("on time", eta)
    assert not priority.should_give_way()  # not before ASK_AHEAD
    worker.timer.fire(limit=1.0)
    assert priority.should_give_way()
    worker.one_process_frees()  # the batch gave way
    assert worker.handed == ["late 1"]  # the process waits for the request, not for the backlog
    worker.offer("on time", eta=eta)
    assert worker.handed == ["late 1", "on time"]
    worker.one_process_frees()
    assert worker.handed == ["late 1", "on time", "late 2"]


def test_a_request_whose_eta_comes_before_the_process_takes_the_place_asked_for_it():
    worker = busy_with_a_backlog()
    eta = soon()
    worker.receive("on time", eta)
    worker.timer.fire(limit=1.0)
    worker.offer("on time", eta=eta)
    assert priority.should_give_way()
    assert not priority.should_give_way()  # one ask for the request, not two
    worker.one_process_frees()
    worker.one_process_frees()
    assert worker.handed == ["late 1", "on time", "late 2"]


def test_nothing_is_asked_ahead_while_a_process_is_free():
    worker = Worker(processes=2)
    worker.offer("late 1")
    eta = soon()
    worker.receive("on time", eta)
    worker.timer.fire(limit=1.0)
    assert not priority.should_give_way()
    worker.offer("on time", eta=eta)
    assert worker.handed == ["late 1", "on time"]


def test_a_process_held_for_a_request_that_does_not_come_goes_back_to_the_pool():
    worker = busy_with_a_backlog()
    worker.receive("dropped", soon())
    worker.timer.fire(limit=1.0)
    worker.one_process_frees()
    assert worker.handed == ["late 1"]
    worker.timer.fire(limit=priority.HOLD_LIMIT)
    assert worker.handed == ["late 1", "late 2"]


def test_a_message_that_arrives_after_its_eta_asks_nothing_ahead():
    worker = Worker(processes=1)
    worker.offer("late 1")
    worker.receive("on time", datetime.now(UTC) - timedelta(seconds=1))
    assert worker.timer.entries == [] and not priority.should_give_way()


def test_a_message_delivered_again_after_celery_dropped_it_asks_afresh():
    worker = busy_with_a_backlog()
    eta = soon()
    worker.receive("on time", eta)
    worker.timer.fire(limit=1.0)
    assert priority.should_give_way()
    worker.one_process_frees()  # held for the request
    worker.lose_connection()  # Celery drops its queued requests
    worker.handed.clear()
    worker.offer("late, taken again")  # the process that was held is free again
    worker.receive("on time", eta)  # the message comes again, with its ETA
    worker.timer.fire(limit=1.0)
    assert priority.should_give_way()
    worker.one_process_frees()
    worker.offer("on time", eta=eta)
    assert worker.handed == ["late, taken again", "on time"]


def test_a_durable_task_call_asks_nothing_ahead():
    worker = busy_with_a_backlog()
    worker.receive("a call", soon(), name="orders.close")
    assert worker.timer.entries == [] and not priority.should_give_way()


def test_an_ask_left_from_before_a_lost_connection_holds_no_process_once_the_message_comes_again():
    # The broker connection is lost while the worker holds a message for its ETA: Celery drops it
    # and clears its semaphore, but the timer still asks ahead for it, late, once the worker is
    # connected and busy again; then the broker delivers the message again.
    worker = busy_with_a_backlog()
    eta = soon()
    worker.receive("on time", eta)
    worker.lose_connection()  # then the worker reconnects
    worker.handed.clear()
    worker.offer("late, taken again")  # the worker is busy again
    worker.timer.fire(limit=1.0)  # the ask left from before the loss
    worker.receive("on time", eta)  # delivered again
    worker.timer.fire(limit=1.0)
    worker.one_process_frees()
    worker.offer("on time", eta=eta)
    worker.timer.fire(limit=priority.HOLD_LIMIT)
    worker.one_process_frees()
    worker.offer("late, after")
    assert worker.handed == ["late, taken again", "on time", "late, after"]


def test_a_process_that_frees_for_an_ask_already_let_go_goes_to_the_next_request():
    worker = busy_with_a_backlog()
    worker.receive("dropped", soon())
    worker.timer.fire(limit=1.0)  # asked ahead, while every process is busy
    worker.timer.fire(limit=priority.HOLD_LIMIT)  # the request did not come, and no process freed
    worker.one_process_frees()
    assert worker.handed == ["late 1", "late 2"]


def test_an_ask_whose_eta_has_passed_asks_nothing():
    worker = busy_with_a_backlog()
    eta = datetime.now(UTC) + timedelta(milliseconds=50)
    worker.receive("held up", eta)
    time.sleep(0.1)  # the timer fires late
    worker.timer.fire(limit=1.0)
    assert not priority.should_give_way()
    worker.one_process_frees()
    assert worker.handed == ["late 1", "late 2"]


def test_a_message_due_sooner_than_one_that_came_before_it_is_asked_for_at_its_own_time():
    worker = Worker(processes=2)
    worker.offer("late 1")
    worker.offer("late 2")
    worker.receive("on time, due later", soon(seconds=2.0))
    worker.receive("on time, due sooner", soon(seconds=1.0))
    assert len(worker.timer.entries) == 1  # the worker's timer holds one entry for both asks
    worker.timer.fire(limit=1.0)
    assert priority.should_give_way() and not priority.should_give_way()
    worker.timer.fire(limit=1.0)
    assert priority.should_give_way()


@pytest.fixture
def event_loop():
    """The event loop of a worker's main process, with its timer, turned by hand."""
    hub = Hub(WorkersTimer())
    yield hub
    hub.close()


def receive_a_burst(worker, count):
    """`count` messages due at one instant arrive, and the time to ask for processes for them comes."""
    eta = soon(seconds=0.05)
    for index in range(count):
        worker.receive(f"burst {index}", eta)
    deadline = time.monotonic() + 5
    while time.time() < eta.timestamp() - priority.ASK_AHEAD and time.monotonic() < deadline:
        time.sleep(0.001)


def due_entries(timer):
    return [entry for at, _, entry in timer.queue if at <= time.monotonic() and not entry.canceled]


def test_a_burst_due_at_one_instant_leaves_nothing_due_after_one_turn_of_the_event_loop(event_loop):
    """The loop fires ten entries of its timer a turn, then waits on its file descriptors, up to a
    second when more entries are due. Asks that find a process free wake nothing, so a burst's asks
    must not take a turn for every ten of its messages: its own ETAs would wait behind them."""
    worker = Worker(processes=2, timer=event_loop.timer)
    receive_a_burst(worker, 50)
    event_loop.fire_timers()
    assert due_entries(event_loop.timer) == []
    assert not priority.should_give_way()  # a process is free: nothing is asked


def test_a_busy_worker_asks_for_every_message_of_a_burst_in_one_turn_of_the_event_loop(event_loop):
    worker = Worker(processes=2, timer=event_loop.timer)
    worker.offer("late 1")
    worker.offer("late 2")
    receive_a_burst(worker, 50)
    event_loop.fire_timers()
    assert sum(priority.should_give_way() for _ in range(60)) == 50
    assert due_entries(event_loop.timer) == []  # what comes next (the ends of the holds) is not due yet
