"""In a prefork Celery worker, tasks claimed on time go before a backlog's.

While every pool process is busy, a worker queues the requests that are ready to run (Celery's
semaphore, sized to the concurrency) and serves them first come, first served. A backlog's batches
reach a worker as soon as it can take them, so that queue is never empty while a backlog drains. A
task claimed on time (published with an ETA just before its run_at) would join it when its ETA
came and wait for every batch ahead of it, then for a process to finish one (docs:
explanation/benchmarks).

So, in the worker's main process, the requests that wait for a process wait in our `_Intake`
(the worker hands them there: the step `OnTimeFirst`), and each process that frees goes to the
first of them: a request of timeouts' that carries an ETA goes before the rest (after those
claimed on time that are due before it), and asks, through memory shared with the pool processes,
for one process to give way. A backlog's batch answers between two of its tasks (one batch for
each ask): it passes the rest on (GiveWay), which frees its process for the request within one
handler's time. A process that frees by itself meanwhile takes the request, and the ask is
withdrawn.

Giving way takes a handler's end, a statement and a publish, and on a busy machine that can be
longer than the few milliseconds between a request's ETA and its due time. So the worker asks
`ASK_AHEAD` before the ETA, when the message is already in its hands (it came with its ETA), and
holds the process freed for it until the ETA comes. Nothing is asked while a process is free.
These asks, and the end of each hold, are timed by one entry of the worker's timer at a time
(`_Timed`), however many messages wait: the worker's event loop makes at most ten timer calls a
turn, and a burst's messages, all due at one instant, would otherwise hold back their own ETAs.

Asks carry a deadline: Celery may drop its queued requests (when the broker connection is lost,
for one), and an ask that nobody answers must not make a batch give way long after. A process held
for a request that does not come goes back to the pool as well. Other pools (threads, solo) queue
nothing, and nothing here applies to them.

Celery has no public hook that orders the requests waiting for a process: the one place this
module goes beyond them, where the worker hands its requests, is celery_internals.py (entry 1).
"""

import bisect
import heapq
import itertools
import multiprocessing
import time
from collections import deque

from celery import bootsteps
from celery.signals import task_received, worker_init

from timeouts import registry
from timeouts.dispatch.publishing import args_repr
from timeouts.protocol import RETRY_POLICY, RUN, RUN_BATCH
from timeouts.worker import celery_internals

# Seconds asks stand. A batch answers within one of its handlers; an older ask is for a request
# that waits for handlers that do not give way (those claimed on time), not for a backlog.
ASK_LIFETIME = 0.5

# Seconds before a request's ETA at which a busy worker asks for a process for it: a batch's giving
# way then falls before the ETA, as long as it takes less. The process freed meanwhile waits idle
# for the request, so this is what a backlog pays for each task claimed on time beside it.
ASK_AHEAD = 0.004
# Seconds after an ask ahead at which the process freed for it, if its request has not come, goes
# back to the pool: the request comes within ASK_AHEAD, unless Celery dropped it.
HOLD_LIMIT = 0.5

# [processes asked to give way, the time.monotonic() until which they are asked], created in the
# worker's main process before its pool forks, so that every pool process shares them.
_asks = None
ASKED, UNTIL = 0, 1
# In the worker's main process: where it hands its requests (None: they keep Celery's order), and
# the asks ahead and the ends of holds still to come (_Timed).
_intake = None
_timed = None
# Processes asked for ahead, by the id of the request they are for.
_ahead = {}


def install() -> None:
    """Connect the signals that set this up in each worker (TimeoutsConfig.ready() calls this)."""
    worker_init.connect(add_steps, dispatch_uid="timeouts.worker.priority.steps")
    task_received.connect(received, dispatch_uid="timeouts.worker.priority.ahead")


def add_steps(sender=None, **kwargs):
    """Before the worker builds its blueprints, which read the app's steps once."""
    sender.app.steps["worker"].add(OnTimeFirst)
    sender.app.steps["consumer"].add(ForgetAsks)


class OnTimeFirst(bootsteps.Step):
    """A step of the worker: once Celery's Pool step has made it (and before its Consumer step, always
    the last, which gives the consumer the worker's `process_task`), the worker hands its requests
    to an `_Intake`. Where the worker queues nothing, requests keep Celery's way."""

    label = "timeouts: on-time work first"
    requires = ("celery.worker.components:Pool",)

    def __init__(self, worker, **kwargs):
        # Every step is made before any is created: the asks exist before the pool's processes fork.
        global _asks, _timed, _intake
        if _asks is None:
            _asks = multiprocessing.Array("d", 2)
        _timed, _intake = _Timed(), None
        super().__init__(worker, **kwargs)

    def create(self, worker):
        global _intake
        intake = _Intake(worker, registry.request_classes())
        if celery_internals.take_requests(worker, intake.take):
            _intake = intake


class _Intake:
    """Where the worker hands each request, in place of Celery's semaphore alone. A request still
    waits for a process on the worker's semaphore (kombu's LaxBoundedSemaphore, which serves its
    waiters first come, first served): each request that waits is one wait on it, and each process
    it gives goes to the first request here, whichever wait it answers. Those claimed on time
    (`_Waiter`s, by ETA) come first, then the rest in the order they came."""

    def __init__(self, worker, kinds_requests=()):
        self.worker, self.semaphore = worker, worker.semaphore
        # The Request classes of the kinds that publish their own messages (registry.Kind.request_class).
        self.kinds_requests = tuple(kinds_requests)
        self.on_time = []  # _Waiter, by ETA; those due at one instant in the order they came
        self.rest = deque()  # every other request

    def claimed_on_time(self, request) -> bool:
        """A message claimed ahead of its due time, which carries an ETA: a batch of timeouts', or a
        message of a kind's own (a stored Celery call)."""
        return _a_batch_claimed_ahead(request) or (request.eta is not None
                                                   and isinstance(request, self.kinds_requests))

    def take(self, request):
        """The worker's `process_task`: a request is ready to run."""
        if not self.claimed_on_time(request):
            self.rest.append(request)
            return self.semaphore.acquire(self._next)
        ahead = _ahead.pop(request.id, None)
        if ahead is not None and ahead.holding:
            ahead.holding = False
            self.hand(request)  # on the process held for it
            return True
        if ahead is not None and ahead in self.on_time:
            ahead.request = request  # the process asked ahead goes to the request when it frees
            return False
        if self.semaphore.value > 0:
            return self.semaphore.acquire(self.hand, request)  # a process is free: it takes it at once
        self.queue(_Waiter(self, request.eta.timestamp(), request=request))
        return False

    def queue(self, waiter):
        """Queue `waiter` (every process is busy) after those claimed on time due before it, before
        the rest, and ask."""
        bisect.insort_right(self.on_time, waiter, key=lambda queued: queued.eta)
        with _asks.get_lock():
            _asks[ASKED] += 1
            _asks[UNTIL] = time.monotonic() + ASK_LIFETIME
        self.semaphore.acquire(self._next)

    def _next(self):
        """A process is free: it goes to the first that waits."""
        if self.on_time:
            self.on_time.pop(0)()
        elif self.rest:
            self.hand(self.rest.popleft())
        else:  # forgotten (forget()) while its wait stood
            self.semaphore.release()

    def hand(self, request):
        celery_internals.hand_to_pool(self.worker, request)

    def forget(self):
        """Celery has cleared its semaphore (the broker connection is lost, or the consumer stops):
        the requests that waited are dropped, as Celery drops them."""
        self.on_time.clear()
        self.rest.clear()


class GiveWay:
    """A backlog's batch's side (batches.run_batch). Asked to give way, it publishes its unstarted
    tasks as a message of their own, as its own message was published (exchange, routing key,
    priority, time limit): behind the backlog's other messages, as if claimed now. They stay
    claimed, under the leases of their claim, so giving way costs a broker round trip while the
    request waits, not a statement, and no dispatcher claims them again. If their leases run out
    first, lease recovery hands them out again, and this message's compare-and-set drops them, as
    for any message that waited too long."""

    def __init__(self, task, shard):
        self.task, self.shard = task, shard

    def asked(self) -> bool:
        return should_give_way()

    def pass_on(self, items):
        """Publish `items`, a slice of this message's own."""
        request = self.task.request
        info = request.delivery_info or {}
        hard_limit = request.timelimit[0] if request.timelimit else None
        args = [items]
        kwargs = {"shard": self.shard}
        self.task.apply_async(
            args=args, kwargs=kwargs, exchange=info.get("exchange"), routing_key=info.get("routing_key"),
            priority=info.get("priority"), time_limit=hard_limit, serializer="json", retry=True,
            retry_policy=RETRY_POLICY, argsrepr=args_repr(args, self.task.app.amqp.argsrepr_maxsize),
            kwargsrepr=repr(kwargs))


def should_give_way() -> bool:
    """In a pool process running a backlog's batch: answer an ask, if one stands."""
    if _asks is None:
        return False
    with _asks.get_lock():
        if _asks[ASKED] < 1:
            return False
        if time.monotonic() > _asks[UNTIL]:
            _asks[ASKED] = 0
            return False
        _asks[ASKED] -= 1
        return True


def received(sender=None, request=None, **kwargs):
    """`task_received`, in the worker's main process, as a message with an ETA arrives (well before
    it: a task is claimed a lead ahead): set the time to ask for a process for it."""
    consumer = sender
    intake = _intake
    # Only for timeouts' batches, not for the messages of a kind's own (a stored Celery call): their
    # starts are recorded ahead by the main process, and processes held for them would let a worker
    # killed -9 run some calls twice (docs: explanation/benchmarks).
    if (intake is None or getattr(consumer, "controller", None) is not intake.worker
            or not _a_batch_claimed_ahead(request)):
        return
    # Delivered again: Celery dropped the request, so the ask made for it since the worker last
    # reconnected (those made before are forgotten: ForgetAsks) is let go.
    dropped = _ahead.pop(request.id, None)
    if dropped is not None:
        dropped.let_go()
    eta = request.eta.timestamp()
    until_ask = eta - ASK_AHEAD - time.time()
    if until_ask > 0:
        _timed.call_after(consumer.timer, until_ask, _ask_ahead, (intake, consumer.timer, request.id, eta))
    elif eta > time.time():
        _ask_ahead(intake, consumer.timer, request.id, eta)


def _ask_ahead(intake, timer, request_id, eta):
    if intake.semaphore.value > 0 or request_id in _ahead:
        return  # a process is free: the request takes it at its ETA, as any other
    if eta <= time.time():
        # Too late to ask ahead: the timer was held up (the worker reconnects to a lost broker in
        # the timer's thread, and Celery dropped the request meanwhile), or the request is being
        # offered now, and asks for itself if it has to wait.
        return
    waiter = _Waiter(intake, eta, request_id=request_id)
    _ahead[request_id] = waiter
    intake.queue(waiter)
    _timed.call_after(timer, HOLD_LIMIT, waiter.let_go)


class _Waiter:
    """In the intake: a request claimed on time, or a process asked for one ahead of its ETA
    (`request` then comes at the ETA, unless the process came first and waits for it)."""

    def __init__(self, intake, eta, request=None, request_id=None):
        self.intake, self.eta, self.request, self.request_id = intake, eta, request, request_id
        self.holding = False
        self.wanted = True  # False once let go: no process is held for it any more

    def __call__(self):
        """A process is free for it. If it was not one that gave way (a batch ended by itself), an
        ask too many stands: no more than the requests that still wait."""
        still_waiting = len(self.intake.on_time)
        with _asks.get_lock():
            _asks[ASKED] = min(_asks[ASKED], still_waiting)
        if self.request is not None:
            self.intake.hand(self.request)
        elif not self.wanted:
            self.intake.semaphore.release()  # to the next that waits, or back to the pool
        else:
            self.holding = True

    def let_go(self):
        """The request did not come within HOLD_LIMIT, or comes again (Celery dropped it): the
        process held for it goes back to the pool, and so does one that frees for it later. A
        process held for good would be a process less until the next lost broker connection, and
        with all of them held, the worker would run nothing."""
        if _ahead.get(self.request_id) is self:
            del _ahead[self.request_id]
        self.wanted = False
        if self.holding:
            self.holding = False
            self.intake.semaphore.release()


class ForgetAsks(bootsteps.StartStopStep):
    """A step of the worker's consumer. When the consumer stops (the broker connection is lost and
    the consumer restarts, or the worker shuts down), Celery clears its semaphore (Consumer.on_close,
    just before the consumer's steps stop): the requests waiting for it, the processes held for them
    and their messages are forgotten. So are those in the intake, and the asks ahead: a process they
    held is free again without being let go."""

    label = "timeouts: forget the asks ahead"

    def stop(self, consumer):
        for waiter in _ahead.values():
            waiter.holding = waiter.wanted = False
        _ahead.clear()
        if _intake is not None:
            _intake.forget()

    shutdown = terminate = stop


class _Timed:
    """Calls to make later in the worker's main process, all made from one entry of the worker's
    timer, set for the earliest. The worker's event loop makes at most ten timer calls a turn, then
    waits on its sockets and pipes, up to a second while more calls are due. An ask that finds a
    process free, or the end of a hold whose request came, does nothing that wakes it: with an
    entry for each message, a burst's (all due at one instant) would take a turn for every ten of
    them, while the burst's own ETAs, due just after, waited behind them."""

    def __init__(self, clock=time.monotonic):
        self._clock = clock  # the worker's timer's clock
        self._calls = []  # a heap of (when, order, function, args)
        self._order = itertools.count()  # calls due at one instant are made in the order they came
        self._entry, self._entry_at = None, None
        self._making = False  # calls are being made: the entry is set once they are

    def call_after(self, timer, seconds, function, args=()):
        heapq.heappush(self._calls, (self._clock() + seconds, next(self._order), function, args))
        if not self._making:
            self._set(timer)

    def _set(self, timer):
        """Have an entry of `timer` set for the earliest call, and only one."""
        if not self._calls:
            return
        when = self._calls[0][0]
        if self._entry is not None and not self._entry.canceled:
            if self._entry_at <= when:
                return
            self._entry.cancel()
        self._entry = timer.call_after(max(0.0, when - self._clock()), self._due, (timer,))
        self._entry_at = when

    def _due(self, timer):
        """The entry's time came: make every call due by now, then set the entry for the next."""
        self._entry, self._making = None, True
        now = self._clock()
        try:
            while self._calls and self._calls[0][0] <= now:
                _, _, function, args = heapq.heappop(self._calls)
                function(*args)
        finally:
            self._making = False
            self._set(timer)


def _a_batch_claimed_ahead(request) -> bool:
    return request.eta is not None and request.name in (RUN, RUN_BATCH)
