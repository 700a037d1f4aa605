"""In a prefork Celery worker, tasks claimed on time go before a backlog's.

While every pool process is busy, a worker queues the requests that are ready to run (Celery's
semaphore, sized to the concurrency) and serves them first come, first served. A backlog's batches
reach a worker as soon as it can take them, so that queue is never empty while a backlog drains. A
task claimed on time (published with an ETA just before its run_at) joined it when its ETA came
and waited for every batch ahead of it, then for a process to finish one (docs:
explanation/benchmarks).

So, in the worker's main process, a request of timeouts' that carries an ETA goes to the front of
that queue (after those claimed on time that are due before it), and asks, through memory shared with the pool
processes, for one process to give way. A backlog's batch answers between two of its tasks (one
batch for each ask): it passes the rest on (GiveWay), which frees its process for the request
within one handler's time. A process that frees by itself meanwhile takes the request, and the ask
is withdrawn.

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
"""

import heapq
import itertools
import multiprocessing
import time
from collections import deque

from celery import bootsteps
from celery.signals import task_received, worker_init

from timeouts.dispatch.publishing import args_repr
from timeouts.durable.starts import StartingRequest
from timeouts.protocol import RETRY_POLICY, RUN, RUN_BATCH

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
# The asks ahead and the ends of holds still to come, in the worker's main process (_Timed).
_timed = None


@worker_init.connect(dispatch_uid="timeouts.worker.priority")
def _install(sender=None, **kwargs):
    """Before the worker builds its pool: the asks then exist before the pool's processes are
    forked, and the worker takes our `_process_task_sem` when it picks its way of handing requests
    to the pool (celery.worker.components.Pool.create)."""
    global _asks, _timed
    worker = sender
    if _asks is None:
        _asks = multiprocessing.Array("d", 2)
    _timed = _Timed()
    worker._process_task_sem = lambda request: _acquire(worker, request)


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


@task_received.connect(dispatch_uid="timeouts.worker.priority.ahead")
def _received(sender=None, request=None, **kwargs):
    """In the worker's main process, as a message with an ETA arrives (well before it: a task is
    claimed a lead ahead): set the time to ask for a process for it."""
    consumer = sender
    worker = getattr(consumer, "controller", None)
    # Not for DurableTask calls (StartingRequest): their starts are recorded ahead by the main
    # process, and with processes held for them a worker killed -9 ran some calls twice
    # (docs: explanation/benchmarks).
    if _asks is None or worker is None or _waiting_of(worker) is None or not _a_batch_claimed_ahead(request):
        return
    # Delivered again: Celery dropped the request, so the ask made for it since the worker last
    # reconnected (those made before are forgotten: ForgetAsks) is let go.
    dropped = _ahead.pop(request.id, None)
    if dropped is not None:
        dropped.let_go()
    eta = request.eta.timestamp()
    until_ask = eta - ASK_AHEAD - time.time()
    if until_ask > 0:
        _timed.call_after(consumer.timer, until_ask, _ask_ahead, (worker, consumer.timer, request.id, eta))
    elif eta > time.time():
        _ask_ahead(worker, consumer.timer, request.id, eta)


def _ask_ahead(worker, timer, request_id, eta):
    if worker.semaphore.value > 0 or request_id in _ahead:
        return  # a process is free: the request takes it at its ETA, as any other
    if eta <= time.time():
        # Too late to ask ahead: the timer was held up (the worker reconnects to a lost broker in
        # the timer's thread, and Celery dropped the request meanwhile), or the request is being
        # offered now, and asks for itself if it has to wait.
        return
    waiter = _Waiter(worker, eta, request_id=request_id)
    _ahead[request_id] = waiter
    _queue(worker, waiter)
    _timed.call_after(timer, HOLD_LIMIT, waiter.let_go)


def _acquire(worker, request):
    """Celery's `_process_task_sem`, except that a request claimed on time that finds every
    process busy goes before every request claimed late, and asks one process to give way."""
    waiting = _waiting_of(worker)
    if waiting is None or not _claimed_on_time(request):
        return worker._quick_acquire(worker._process_task, request)
    ahead = _ahead.pop(request.id, None)
    if ahead is not None and ahead.holding:
        ahead.holding = False
        worker._process_task(request)  # on the process held for it
        return True
    if ahead is not None and ahead in (callback for callback, _, _ in waiting):
        ahead.request = request  # the process asked ahead goes to the request when it frees
        return False
    if worker.semaphore.value > 0:
        return worker._quick_acquire(worker._process_task, request)
    _queue(worker, _Waiter(worker, request.eta.timestamp(), request=request))
    return False


class _Waiter:
    """In Celery's queue: a request claimed on time, or a process asked for one ahead of its ETA
    (`request` then comes at the ETA, unless the process came first and waits for it)."""

    def __init__(self, worker, eta, request=None, request_id=None):
        self.worker, self.eta, self.request, self.request_id = worker, eta, request, request_id
        self.holding = False
        self.wanted = True  # False once let go: no process is held for it any more

    def __call__(self):
        """A process is free for it. If it was not one that gave way (a batch ended by itself), an
        ask too many stands: no more than the requests that still wait."""
        still_waiting = _waiting_first(self.worker.semaphore._waiting)
        with _asks.get_lock():
            _asks[ASKED] = min(_asks[ASKED], still_waiting)
        if self.request is not None:
            self.worker._process_task(self.request)
        elif not self.wanted:
            self.worker.semaphore.release()  # to the next in the queue, or back to the pool
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
            self.worker.semaphore.release()


# Processes asked for ahead, by the id of the request they are for.
_ahead = {}


class ForgetAsks(bootsteps.StartStopStep):
    """A step of the worker's consumer. When the consumer stops (the broker connection is lost and
    the consumer restarts, or the worker shuts down), Celery clears its semaphore: the requests
    queued there, the processes held for them and their messages are forgotten. So are the asks
    ahead: a process they held is free again without being let go."""

    label = "timeouts: forget the asks ahead"

    def stop(self, consumer):
        for waiter in _ahead.values():
            waiter.holding = waiter.wanted = False
        _ahead.clear()

    shutdown = stop


@worker_init.connect(dispatch_uid="timeouts.worker.priority.steps")
def _add_consumer_step(sender=None, **kwargs):
    """Before the worker builds its consumer, which reads its steps once."""
    sender.app.steps["consumer"].add(ForgetAsks)


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


def _queue(worker, waiter):
    """Queue `waiter` after those claimed on time due before it, before the rest, and ask."""
    waiting = worker.semaphore._waiting
    first = _waiting_first(waiting)
    index = next((index for index in range(first) if waiting[index][0].eta > waiter.eta), first)
    waiting.insert(index, (waiter, (), {}))
    with _asks.get_lock():
        _asks[ASKED] += 1
        _asks[UNTIL] = time.monotonic() + ASK_LIFETIME


def _waiting_of(worker):
    # kombu's LaxBoundedSemaphore has no way to queue a waiter first: its queue is a deque of
    # (callback, args, kwargs), release() pops the left end, and ours are the first there. Without
    # that deque (another kombu, or a pool that queues nothing), requests keep Celery's order.
    waiting = getattr(getattr(worker, "semaphore", None), "_waiting", None)
    return waiting if isinstance(waiting, deque) else None


def _waiting_first(waiting) -> int:
    """How many requests claimed on time (or processes asked for ahead) wait, at the front."""
    return next((index for index, (callback, _, _) in enumerate(waiting) if not isinstance(callback, _Waiter)),
                len(waiting))


def _claimed_on_time(request) -> bool:
    return _a_batch_claimed_ahead(request) or (request.eta is not None and isinstance(request, StartingRequest))


def _a_batch_claimed_ahead(request) -> bool:
    return request.eta is not None and request.name in (RUN, RUN_BATCH)
