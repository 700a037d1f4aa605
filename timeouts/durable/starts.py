"""Starting a stored Celery call while its message waits in the worker, off the pool's time.

The dispatcher publishes a call claimed ahead with a Celery ETA, and the worker's main process
holds the message in its timer until then, as it holds any ETA message. The call's
compare-and-set start is a durable commit. Recorded by the pool process at the eta, that commit
would be in the call's lateness; recorded there a little before the eta, the pool process would
be held, waiting, for every call. Either way, calls due close together queue for a pool process,
where Celery's own ETA calls do not.

So the worker's main process records the start while the message waits: a `StartingRequest` (the
Request class of `DurableTask`) hands the call's fence to a thread of the main process as soon as
the message is received, and that thread runs the compare-and-set (`start_task`, allowed
`START_AHEAD` before run_at) on a connection of its own. When the timer fires (the message's eta
is ETA_HEADROOM before run_at, the time the main process takes to hand a message to a pool
process), the start goes to the pool process with the message: that process waits out the rest
of run_at by the database clock (`_DatabaseClock`) and runs the body at once.

A call may wait for a pool process long after its eta, when every process is busy. Its start is
leased meanwhile: the main process keeps the lease alive (leases.py) from the start's answer until
the pool process takes the call over (Celery counts the request accepted), holding nothing of the
request meanwhile (`_while_waiting`). A pool process that takes the call over within half its TTR
of the start runs the body at once: its lease cannot have run out. Later, it runs the body only
once the database confirms that the start still holds (`confirm_start`, which renews the lease);
else it drops the message. So a call is never run on a start that lease recovery took back, nor
after a cancel that returned True.

The thread records the starts of the messages received while its previous statement ran in one
statement: the calls that one claim published together arrive together, and share one durable
commit.

Whatever happens, the compare-and-set is run once, by one process, for each message:
- not started yet when the eta comes (a slow database): the thread no longer runs it, and the
  pool process starts the call itself, as for a message received without an ETA;
- being started when the eta comes: the timer waits for the statement's answer;
- refused (a stale message, a cancel that won, a run_at further ahead than START_AHEAD): the
  pool process tries the compare-and-set itself, and drops the message as it always has.

A start recorded ahead is for a message the worker holds unacknowledged. When the worker drops
the messages it holds for their eta (it shuts down, or its broker connection is lost: Celery
clears them, since they cannot be acknowledged on a new connection), the broker delivers them
again, or never (Redis without ack emulation), but their attempts are taken. The consumer step
`GiveBackStarts` gives those starts back (`give_back_call_starts`) whenever the consumer stops,
so each call is published again at once rather than when its lease runs out. A start is either
handed to a pool process or given back, never both, whichever comes first (the consumer may stop
on another thread than the timer's). A worker killed outright cannot give its starts back: its
calls run again once their leases run out, as those of a worker lost mid-run do.
"""

import logging
import os
import threading
import time
import weakref
from collections import deque

from celery import bootsteps
from celery.signals import worker_init
from celery.worker import state as worker_state
from celery.worker.request import Request

from timeouts.protocol import FENCE_HEADER, from_header, header
from timeouts.store.attempts import params_by_shard
from timeouts.worker import leases

logger = logging.getLogger(__name__)

# How long before its run_at a call's start may be recorded. The dispatcher claims and publishes
# up to its lead ahead (DISPATCH_LEAD; more with --lead): a message received earlier than this
# is started by its pool process.
START_AHEAD = 1.0  # seconds
# How long the timer waits for a start the thread has begun: one statement's answer.
ANSWER_TIMEOUT = 5.0  # seconds
# The most starts recorded in one statement: the calls received while the previous one ran.
MAX_STARTS = 100
# The part of its TTR during which a start holds without a look at its row (worker/attempt.py,
# _confirmed): a pool process that takes the call over by then has its heartbeat extend the lease
# within another third of the TTR, before the whole TTR from the start has passed.
HOLDS_FOR = 0.5


class StartingRequest(Request):
    """Celery's Request, for `DurableTask`: a call received ahead of its eta is started ahead."""

    def __init__(self, message, **kwargs):
        super().__init__(message, **kwargs)
        self._ahead = None
        self._handed = None  # the start handed over with this request, until a pool process accepts it
        fields = self._request_dict.get(FENCE_HEADER)
        if fields and self._eta is not None and self._eta.timestamp() > time.time():
            try:
                fence = from_header(fields)
            except (TypeError, ValueError):  # not a fence: the pool process's DurableTask says so
                return
            if fence.started is None:
                self._ahead = _starter.submit(fence)

    def __init_subclass__(cls, **kwargs):
        # The worker runs requests through a subclass made per task (celery.worker.request's
        # create_request_cls), whose execute_using_pool does not call this class's: wrap its own.
        super().__init_subclass__(**kwargs)
        execute = cls.__dict__.get("execute_using_pool")
        if execute is not None:
            def execute_using_pool(self, pool, **options):
                self._hand_over_start()
                return execute(self, pool, **options)
            cls.execute_using_pool = execute_using_pool

    def execute_using_pool(self, pool, **options):
        self._hand_over_start()
        return super().execute_using_pool(pool, **options)

    def _hand_over_start(self):
        """Put the start recorded ahead, if any, into the fence the pool process reads."""
        ahead, self._ahead = self._ahead, None
        started = ahead and ahead.take(_while_waiting(self))
        if started is not None:
            self._handed = ahead
            self._request_dict[FENCE_HEADER] = header(ahead.fence.with_started(started))

    def on_accepted(self, pid, time_accepted):
        """A pool process has taken the call over (Celery counts the request accepted): its own
        heartbeat keeps the lease from then on. This process lets the lease go at once rather than
        at its heartbeat's next beat (_while_waiting)."""
        handed, self._handed = self._handed, None
        if handed is not None:
            handed.taken_over()
        super().on_accepted(pid, time_accepted)

    def _waits_for_a_process(self) -> bool:
        """Handed to the pool, and neither taken by a pool process (accepted), nor ended, nor
        dropped yet, as the worker's state tracks its requests."""
        return self in worker_state.reserved_requests and self not in worker_state.active_requests


def _while_waiting(request):
    """`request._waits_for_a_process`, holding the request weakly: a request gone is not waiting.

    The heartbeat asks a lease whether to keep it only at its next beat, up to a third of the TTR
    later. A lease that held its request would keep each request handed over alive that long in the
    worker's main process, with its message and arguments, where the garbage collector moves them to
    its oldest generation: its full collections then come more often and take longer, and each one
    stops every thread of the main process (the timer that hands calls to the pool, the thread that
    starts them ahead) while it lasts, which makes the calls due meanwhile late."""
    ref = weakref.ref(request)

    def waiting() -> bool:
        alive = ref()
        return alive is not None and alive._waits_for_a_process()

    return waiting


class _Start:
    """One call's start, from the thread that records it to the request that hands it over or the
    consumer step that gives it back: one of the two, never both."""

    def __init__(self, fence):
        self.fence = fence
        self.lock = threading.Lock()
        # then "starting" and "answered", then "handed over" (to a pool process) or "given back"
        # (the worker dropped the message); or "abandoned" (the pool process starts it itself)
        self.state = "waiting"
        self.started = None  # what the pool process gets: {"row": ..., "not_before": ...}
        self.lease = None  # the recorded start's, which this process keeps (leases.py)
        self.answered = threading.Event()

    def begin(self) -> bool:
        with self.lock:
            if self.state != "waiting":
                return False
            self.state = "starting"
            return True

    def answer(self, started) -> bool:
        """Record the answer; False if the start was given back or abandoned meanwhile (the caller
        then gives back what it recorded). A start recorded is leased: the lease is kept from now
        until the start is given back, or taken over by the pool process that runs the call."""
        with self.lock:
            kept = self.state == "starting"
            if kept:
                self.started, self.state = started, "answered"
                if started is not None:
                    fence = self.fence
                    self.lease = leases.heartbeat.add(fence.shard, fence.key, fence.attempt, started["row"]["ttr"])
        self.answered.set()
        return kept

    def give_back(self):
        """The recorded start to give back, or None; never handed over after this. One handed over
        already is the pool process's: None."""
        with self.lock:
            if self.state in ("handed over", "abandoned"):
                return None
            started = self.started if self.state == "answered" else None
            self.started, self.state = None, "given back"
            leases.heartbeat.remove(self.lease)
        self.answered.set()
        return started

    def taken_over(self):
        """The pool process that runs the call has it (Celery counts its request accepted): this
        process no longer keeps its lease."""
        leases.heartbeat.remove(self.lease)

    def take(self, waiting=None):
        """The recorded start, handed over once, and never given back after this; None when there is
        none (the pool process then starts the call itself). This process keeps its lease for as
        long as `waiting()` says that the request waits for a pool process, whose own heartbeat
        then keeps it."""
        _starter.taken(self)
        with self.lock:
            if self.state == "waiting":
                self.state = "abandoned"
                return None
        if not self.answered.wait(ANSWER_TIMEOUT):
            logger.warning("timeouts: no answer in %s s to the start of job %s", ANSWER_TIMEOUT, self.fence.job_id)
        with self.lock:
            if self.state == "answered" and self.started is not None:
                self.state = "handed over"
                if waiting is None:
                    leases.heartbeat.remove(self.lease)
                else:
                    self.lease.keep = waiting
                return self.started
            if self.state == "starting":
                # No answer in time. If the start commits, the thread gives it back on its answer;
                # the pool process's own compare-and-set takes either the row or nothing.
                self.state = "abandoned"
            return None


class _Starter:
    """The main process's thread that records the starts, and the starts not handed over yet."""

    def __init__(self):
        self.lock = threading.Lock()
        self.queue = deque()
        self.held = set()  # submitted, not handed over to a pool process yet
        self.wake = threading.Event()
        self.pid = None

    def submit(self, fence) -> _Start:
        start = _Start(fence)
        with self.lock:
            self.queue.append(start)
            self.held.add(start)
            if self.pid != os.getpid():
                self.pid = os.getpid()
                threading.Thread(target=self._run, name="timeouts-call-starts", daemon=True).start()
        self.wake.set()
        return start

    def taken(self, start):
        with self.lock:
            self.held.discard(start)

    def _run(self):
        while True:
            self.wake.wait()
            self.wake.clear()
            while True:
                with self.lock:
                    batch = [self.queue.popleft() for _ in range(min(len(self.queue), MAX_STARTS))]
                if not batch:
                    break
                begun = [start for start in batch if start.begin()]
                for start, started in zip(begun, _record([start.fence for start in begun]), strict=True):
                    if not start.answer(started) and started is not None:
                        _give_back([start.fence])

    def give_back(self):
        """Give back the starts of every message the worker holds: it has dropped them all."""
        with self.lock:
            starts, self.held = list(self.held), set()
        # One being recorded now is given back by the thread, once its answer comes.
        _give_back([start.fence for start in starts if start.give_back() is not None])


def _give_back(fences):
    from timeouts.store import attempts, worker_connection

    calls = [(fence.shard, fence.job_id, fence.action_time, fence.attempt) for fence in fences]
    for shard, params in params_by_shard(calls).items():
        try:
            with worker_connection.used(shard):
                attempts.give_back_call_starts(params)
        except Exception:
            logger.exception("timeouts: could not give back %d calls started ahead; they run again "
                             "once their leases run out", len(params["job_ids"]))


def _record(fences) -> list:
    """The compare-and-set starts of calls (those of one shard in one statement where they share a
    partition), each what its pool process gets, or None (refused, or the database failed)."""
    from timeouts.store import worker_connection
    from timeouts.worker import attempt

    by_shard = {}
    for fence in fences:
        by_shard.setdefault(fence.shard, []).append(fence)
    started = {}
    for shard, group in by_shard.items():
        try:
            with worker_connection.used(shard):
                sent = time.monotonic()
                rows = attempt.start_calls_ahead(group, START_AHEAD)
                answered = time.monotonic()
        except Exception:
            logger.exception("timeouts: could not start %d calls ahead; their pool processes start them", len(group))
            continue
        for fence in group:
            row = rows.get(fence.job_id)
            if row is not None:
                started[id(fence)] = _handed_over(row, shard, sent, answered)
    return [started.get(id(fence)) for fence in fences]


def _handed_over(row, shard, sent, answered) -> dict:
    """What the pool process gets of a start: the row; when, by this machine's monotonic clock, the
    database's clock reaches its run_at (`not_before`); and until when the start surely holds
    (`holds_until`): its lease runs a whole TTR from a moment after `sent`, and the pool process's
    heartbeat extends it within a third of a TTR of taking it over."""
    row["attribute"] = None  # the call itself travels in the message
    offset = _database_clock.offset(shard, row.pop("database_now").timestamp() - answered)
    return {"row": row, "not_before": row["run_at"].timestamp() - offset,
            "holds_until": sent + row["ttr"] * HOLDS_FOR}


class _DatabaseClock:
    """How far ahead of this machine's monotonic clock each shard's database clock is, at least.

    The database read its clock before its answer came: database_now - (monotonic time of the
    answer) is never more than the true offset. Each answer gives such a bound, short of the truth
    by the time from the clock read to the answer; the largest of the last WINDOW seconds' is the
    closest. Bounds older than that are dropped, so the two clocks drifting apart (NTP slews at
    most 0.05 %) moves the result by microseconds."""

    WINDOW = 1.0  # seconds

    def __init__(self):
        self.bounds = {}  # shard -> deque of (monotonic time, bound)

    def offset(self, shard, bound) -> float:
        now = time.monotonic()
        bounds = self.bounds.setdefault(shard, deque())
        bounds.append((now, bound))
        while bounds[0][0] < now - self.WINDOW:
            bounds.popleft()
        return max(b for _, b in bounds)


_database_clock = _DatabaseClock()


_starter = _Starter()


class GiveBackStarts(bootsteps.StartStopStep):
    """A step of the worker's consumer: when the consumer stops (the worker shuts down, or the broker
    connection is lost and the consumer restarts), Celery drops the messages it holds for their
    eta; the starts recorded for them are given back."""

    label = "timeouts: give back calls started ahead"

    def stop(self, consumer):
        _starter.give_back()

    shutdown = stop


def install() -> None:
    """Connect the signal that adds GiveBackStarts to each worker (TimeoutsConfig.ready() calls this)."""
    worker_init.connect(_add_consumer_step, dispatch_uid="timeouts.durable.starts")


def _add_consumer_step(sender=None, **kwargs):
    """Before the worker builds its consumer, which reads its steps once."""
    sender.app.steps["consumer"].add(GiveBackStarts)
