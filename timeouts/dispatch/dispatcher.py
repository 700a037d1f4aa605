"""The low-latency dispatcher: sleep until the nearest deadline, or until a NOTIFY announces an
earlier one, then claim and publish what is due.

It knows only one number, the nearest pending deadline. It reads it from the table (one indexed
query) after every (re)connect and at least every NOTIFY_HORIZON / 2, and lowers it when a
notification brings an earlier deadline. Between those it sleeps on its LISTEN socket, so tasks far
in the future cost nothing. Claiming and publishing are the scan's own code (`claim_due`,
`publish`), on a connection of its own (worker_connection.py: a claim is prepared, and CONN_MAX_AGE
does not reopen it every round): SKIP LOCKED lets any number of dispatchers (and scans) run at
once without a task being published twice.

Between claims, at most once a second (late_sweep.py), it ends the PENDING tasks that their
lateness policy would end at their start, so that they are never claimed nor sent to a worker:
only while its nearest deadline (the oldest waiting task's) is older than the smallest such
policy, which the same read returns.

Times: deadlines are on the database clock; the dispatcher maps them onto its local monotonic clock
through the offset measured at every read, and only ever sleeps on the local clock. Waking a little
early or late is harmless: `claim_due` decides what is due by the database clock, and the worker's
compare-and-set refuses to start a task before its run_at.
"""

import logging
import threading
import time

import psycopg
from django.db import DEFAULT_DB_ALIAS
from django.db import Error as DjangoDatabaseError

from timeouts.conf import get_settings
from timeouts.dispatch.broker_deadline import PublishFailed, publish_bounded, warm_up_broker
from timeouts.dispatch.claiming import MAX_CLAIM, claim_due
from timeouts.dispatch.late_sweep import Sweeper
from timeouts.dispatch.listener import Backoff, Listener, connection_params
from timeouts.limiting import controls
from timeouts.storage import shards
from timeouts.store import last_claims, worker_connection

logger = logging.getLogger("timeouts.dispatcher")

KEEPALIVE_INTERVAL = 10.0  # seconds between nearest-deadline reads when nothing happens
QUERY_TIMEOUT = 5.0  # seconds a read on the LISTEN connection may take before it counts as dead
PUBLISH_TIMEOUT = 10.0  # seconds one chunk of messages may take to reach the broker
STOP_CHECK = 0.5  # seconds: the longest sleep between two looks at the stop event
# Seconds to wake after (deadline - lead): waking a hair early claims nothing and costs a second
# claim, and mapping the database clock onto the local one is good to a fraction of a millisecond.
WAKE_MARGIN = 0.001
# Seconds between claims of a biz_type at its concurrency limit that has tasks due: a task that
# ends wakes nobody, so a dispatcher looks again this often (the scan does, every SCAN_INTERVAL).
CONCURRENCY_POLL = 0.05

DATABASE_ERRORS = (psycopg.Error, DjangoDatabaseError)


class Stats:
    """Counters for operators and tests; `wait_for` lets a test wait for a count, not sleep."""

    FIELDS = ("connects", "reconnects", "reads", "notifications", "wakeups", "claimed", "published",
              "queries", "errors", "publish_failures", "ended_late")

    def __init__(self):
        self._changed = threading.Condition()
        for name in self.FIELDS:
            setattr(self, name, 0)

    def add(self, **counts):
        with self._changed:
            for name, count in counts.items():
                setattr(self, name, getattr(self, name) + count)
            self._changed.notify_all()

    def wait_for(self, predicate, timeout) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: predicate(self), timeout)

    def snapshot(self) -> dict:
        with self._changed:
            return {name: getattr(self, name) for name in self.FIELDS}


class Dispatcher:
    """Dispatches the tasks of one shard (`alias`); `run_on_every_shard` runs one per shard."""

    def __init__(self, *, alias=DEFAULT_DB_ALIAS, lead=None, batch_size=None, listener=None, stop=None,
                 clock=time.monotonic, keepalive_interval=KEEPALIVE_INTERVAL, publish_timeout=PUBLISH_TIMEOUT,
                 stats=None):
        settings = get_settings()
        self.alias = alias
        self.lead = float(settings.DISPATCH_LEAD if lead is None else lead)
        self.batch_size = min(settings.SCAN_BATCH_SIZE if batch_size is None else batch_size, MAX_CLAIM)
        # Tasks due beyond the horizon send no NOTIFY: reading every horizon / 2 finds them in time.
        # Never more often than once a second (the idle budget), whatever the horizon.
        self.read_interval = max(1.0, min(keepalive_interval, settings.NOTIFY_HORIZON / 2))
        self.publish_timeout = publish_timeout
        self.listener = listener or Listener(settings.NOTIFY_CHANNEL,
                                             connection_params(alias, query_timeout=QUERY_TIMEOUT),
                                             query_timeout=QUERY_TIMEOUT)
        self.stop = stop or threading.Event()
        self.clock = clock
        self.stats = stats or Stats()
        # Ends PENDING tasks already later than their lateness policy allows (late_sweep.py).
        self.late_sweep = Sweeper(clock)

        self.wake_at = None  # local clock: nearest deadline minus lead; None when nothing is pending
        self.db_offset = 0.0  # database epoch seconds minus local clock, measured at each read
        self.next_read = 0.0
        self.not_before = 0.0  # no claims before this (backing off a busy row or a failing broker)
        self.last_claim = float("-inf")  # local clock
        self.empty_claims = 0  # wake-ups in a row that left tasks due after a batch that was not full
        self.reconnect_backoff = Backoff(first=0.05, cap=5.0)
        # Short: a claim held back by backpressure waits here while workers drain the broker, and the
        # broker must not run dry meanwhile (MAX_DISPATCHED tasks last far longer than the cap).
        self.contention_backoff = Backoff(first=0.01, cap=0.1)
        self.broker_backoff = Backoff(first=0.5, cap=10.0)

    def run(self):
        """Dispatch until `stop` is set. Survives database and broker faults."""
        logger.info("timeouts.dispatcher: started on %s (lead %s s, batch %s)", self.alias, self.lead,
                    self.batch_size)
        warm_up_broker()
        with worker_connection.used(self.alias):
            self._run()

    def _run(self):
        try:
            while self._connect():
                try:
                    self._serve()
                except DATABASE_ERRORS as exc:
                    logger.warning("timeouts.dispatcher: database connection lost (%s)", exc)
                    self._after_fault()
                except Exception:
                    logger.exception("timeouts.dispatcher: unexpected error; starting over")
                    self._after_fault()
        finally:
            self._disconnect()
            logger.info("timeouts.dispatcher: stopped")

    # -- connection ----------------------------------------------------------------------------

    def _connect(self) -> bool:
        """Connect and LISTEN, retrying with backoff. False when told to stop first."""
        while not self.stop.is_set():
            try:
                self.listener.connect()
            except psycopg.Error as exc:
                delay = self.reconnect_backoff.next_delay()
                logger.warning("timeouts.dispatcher: cannot connect (%s); retrying in %.2f s", exc, delay)
                self.stop.wait(delay)
                continue
            again = self.stats.connects > 0
            self.stats.add(connects=1, reconnects=int(again), queries=1)
            if again:
                logger.warning("timeouts.dispatcher: reconnected (backend %s)", self.listener.backend_pid)
            return True
        return False

    def _after_fault(self):
        self.stats.add(errors=1)
        self._disconnect()
        # Also after a connect that worked: a fault right after connecting must not loop hot.
        self.stop.wait(self.reconnect_backoff.next_delay())

    def _disconnect(self):
        self.listener.close()
        try:
            worker_connection.current().close()  # it may have died with the database
        except DjangoDatabaseError:
            pass

    # -- the loop ------------------------------------------------------------------------------

    def _serve(self):
        # The handlers' own limits, as the code this process runs declares them (controls.py).
        controls.declare()
        # Notifications sent while we were not listening are lost: the table is the truth.
        self._read_deadline()
        while not self.stop.is_set():
            now = self.clock()
            if now >= self.next_read:
                self._read_deadline()  # the keepalive, and how tasks beyond the horizon are found
            elif self.late_sweep.due(now):
                self._sweep()
            elif self._due(now):
                self._dispatch()
                self._take(self.listener.wait(0))  # drain what arrived meanwhile (no query)
            else:
                self._sleep(now)

    def _due(self, now) -> bool:
        return self.wake_at is not None and now >= max(self.wake_at, self.not_before)

    def _sleep(self, now):
        until = min(self.next_read, now + STOP_CHECK)
        if self.late_sweep.wake_at is not None:
            until = min(until, self.late_sweep.wake_at)
        if self.wake_at is not None:
            until = min(until, max(self.wake_at, self.not_before))
        self._take(self.listener.wait(until - now))
        self.reconnect_backoff.reset()  # slept on a healthy connection

    def _take(self, payloads):
        """Lower the wake-up time to the earliest notified deadline."""
        for payload in payloads:
            self.stats.add(notifications=1)
            try:
                deadline = float(payload)
            except ValueError:
                logger.warning("timeouts.dispatcher: unexpected notification %r; re-reading", payload)
                self.next_read = 0.0
                continue
            local = self._local(deadline)
            if self.wake_at is None or local < self.wake_at:
                self.wake_at = local

    def _read_deadline(self):
        row = self.listener.query("nearest_deadline")
        # The database read its clock at the end of the query (after parsing and planning, which
        # can take a while on a new connection): closer to our clock now than at sending.
        after = self.clock()
        self.stats.add(reads=1, queries=1)
        self.db_offset = row["now"] - after
        self.wake_at = None if row["deadline"] is None else self._local(row["deadline"])
        self.late_sweep.note(None if row["deadline"] is None else row["deadline"] - self.db_offset,
                             row["min_lateness"])
        self.next_read = after + self.read_interval

    def _read_claimable(self) -> bool:
        """When limits or pauses hold some biz_types back, lower the wake-up time to when the next
        task may be claimed, not merely fall due; False when none is limited or paused."""
        # The poll is counted from the wake-up, which comes a lead before the deadline.
        row = self.listener.query("claimable_deadline", {"concurrency_poll": CONCURRENCY_POLL + self.lead,
                                                         **shards.position(self.alias)})
        self.stats.add(reads=1, queries=1)
        if not row["held"]:
            return False
        self.wake_at = None if row["deadline"] is None else self._local(row["deadline"])
        return True

    def _local(self, deadline: float) -> float:
        """When to wake, on the local clock, for a deadline in database epoch seconds: a lead before
        it. But not sooner than half a lead after the last claim, unless that would leave less than
        half a lead: tasks due one after another are then claimed a half lead's worth at a time and
        travel together (RUN_BATCH_SIZE), rather than a claim and a message each."""
        wake = deadline - self.db_offset - self.lead + WAKE_MARGIN
        return min(max(wake, self.last_claim + self.lead / 2), wake + self.lead / 2)

    # -- claiming and publishing -----------------------------------------------------------------

    def _claim_lead(self) -> float:
        """How far ahead to claim: the lead, and a backoff's longest more while claims are held back
        (backpressure, or rows another claimer holds). The next claim may then come that much
        later, and a task of another biz_type that falls due before it is claimed now, still a
        lead ahead of its time, in time for its message to reach a worker before its ETA."""
        return self.lead + (self.contention_backoff.cap if self.empty_claims > 1 else 0.0)

    def _sweep(self):
        """End the PENDING tasks that their lateness policy would end at their start (late_sweep.py)."""
        self.stats.add(queries=1, ended_late=self.late_sweep.sweep())

    def _dispatch(self):
        """Claim and publish batch after batch while they come back full; sweep between them when due."""
        self.stats.add(wakeups=1)
        started = self.last_claim = self.clock()
        claimed = published = 0
        while True:
            if self.late_sweep.due(self.clock()):
                self._sweep()  # a long run of full batches would otherwise claim the late tasks first
            claims = claim_due(self.batch_size, lead=self._claim_lead())
            self.stats.add(queries=1, claimed=len(claims))
            claimed += len(claims)
            full = len(claims) == self.batch_size
            try:
                published += publish_bounded(claims, self.publish_timeout)
            except PublishFailed as exc:
                delay = self.broker_backoff.next_delay()
                self.not_before = self.clock() + delay
                self.stats.add(errors=1, publish_failures=1, published=published)
                logger.error("timeouts.dispatcher: %s; claims released, pausing %.1f s", exc, delay)
                return
            if not full or self.stop.is_set():
                break
        # For the health check, once its claims are on their way: the note never delays a message.
        last_claims.note_claim("dispatcher")
        self.broker_backoff.reset()
        self.stats.add(published=published)
        deadline = self.wake_at + self.lead - WAKE_MARGIN
        logger.debug("timeouts.dispatcher: woke at the deadline %+.1f ms; claimed %d, published %d in %.1f ms",
                     (started - deadline) * 1000, claimed, published, (self.clock() - started) * 1000)
        self._read_deadline()
        still_due = not full and self.wake_at is not None and self.wake_at <= self.clock()
        if still_due and self._read_claimable():
            # Tasks due but held back by the limits or pauses of their biz_types wait until one may
            # be claimed: asleep until then, and any other task's NOTIFY wakes it as usual.
            still_due = self.wake_at is not None and self.wake_at <= self.clock()
        if still_due:
            # Still due after a batch that was not full. Once, that is the clocks' rounding at the
            # edge of the lead: claim again at once. Again and again, either backpressure holds the
            # claims back (MAX_DISPATCHED unstarted: the workers are the bottleneck) or another
            # claimer or a cancel holds the rows: let them move on instead of spinning a hot loop
            # of tiny claims, which starves the very workers and database it waits for.
            self.empty_claims += 1
            if self.empty_claims > 1:
                self.not_before = self.clock() + self.contention_backoff.next_delay()
        else:
            self.empty_claims = 0
            self.contention_backoff.reset()
        self.reconnect_backoff.reset()


def run_on_every_shard(stop: threading.Event, **options):
    """A dispatcher per shard, each in a thread of its own with its own connections, until `stop`
    is set: a shard that is down or slow holds back only its own dispatcher (which backs off alone)."""
    aliases = shards.aliases()
    if len(aliases) == 1:
        Dispatcher(alias=aliases[0], stop=stop, **options).run()
        return
    threads = [threading.Thread(target=Dispatcher(alias=alias, stop=stop, **options).run,
                                name=f"timeouts-dispatcher-{alias}", daemon=True) for alias in aliases]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
