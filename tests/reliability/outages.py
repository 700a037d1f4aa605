"""Helpers of the database and broker outage scenarios (test_database_faults.py, test_broker_faults.py).

- `scaled(n)`: the sizes times TIMEOUTS_RELIABILITY_SCALE (default 1.0: the sizes CI runs).
- `BurstScheduler`: a thread that schedules tasks in chunks through oracle.Scheduler, going on through
  outages (a chunk whose transaction failed is recorded rolled back or unknown, and the next one tries
  again), until `total` tasks committed.
- `BackendKiller`: a thread that pg_terminate_backend()s the sessions of chosen application names every
  few seconds, counting kills and the distinct backends (each new one is a reconnect) it saw.
- `PersistentRedis`: a ThrowawayRedis with an append-only file, so a stop (SIGTERM) keeps the queued
  messages, and `restart_empty()`, a restart that loses them.
- `Timeline`: when each fault began and ended, and what followed, measured on the oracle's and the
  system's clocks; `numbers()` prints and saves what a scenario observed (for the README).

The system's processes get application names through their DATABASE_URL (`app_url`), so the killer
and pg_stat_activity tell a scan from a worker; the dispatcher's LISTEN session is always named
timeouts.dispatch.listener.APPLICATION_NAME.
"""

import json
import random
import shutil
import signal
import subprocess
import threading
import time

import psycopg

from tests.support.broker_messages import queue_length
from tests.support.processes import wait_for
from timeouts.dispatch.listener import APPLICATION_NAME as LISTENER_NAME

from .clusters import REDIS_SERVER, ThrowawayRedis
from .oracle import Oracle, Scheduler
from .race_tools import SCALE, scaled  # noqa: F401  (scaled is part of this module's API for the tests)

# Workers: 8 threads start more handlers a second than a prefork pool of 2-3 on a 2-core machine
# (the handlers mostly wait on their databases). The claim cap keeps a claim's wait in the
# broker under half the oracle.ok lease (5 s) at that rate (MAX_DISPATCHED <= starts/s x TTR / 2):
# a cap the workers cannot drain within the lease makes every lease expire and every task be
# published again and again, several messages per task.
WORKER = {"pool": "threads", "concurrency": 8}
ENV = {"TIMEOUTS_MAX_DISPATCHED": 150}


def app_url(url, name):
    """The database URL with an application_name (dj_database_url passes it on to libpq)."""
    return f"{url}{'&' if '?' in url else '?'}application_name={name}"


def backends(url, names) -> dict:
    """{application_name: [backend pids]} of the sessions with those names."""
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        rows = conn.execute("SELECT application_name, pid FROM pg_stat_activity WHERE application_name = ANY(%s)",
                            [list(names)]).fetchall()
    found = {name: [] for name in names}
    for name, pid in rows:
        found[name].append(pid)
    return found


def listeners(url) -> list:
    return backends(url, [LISTENER_NAME])[LISTENER_NAME]


def sleep_checking(system, seconds):
    """Wait `seconds`, raising at once if a process of the system died meanwhile."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        system.check_alive()
        time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))


class BurstScheduler(threading.Thread):
    """Schedules `total` tasks (committed) due `delay` seconds (a random range) after their insert, in
    transactions of `chunk`, as fast as the database takes them (or at `rate` per second)."""

    def __init__(self, sut_url, oracle_dsn, total, *, chunk=250, delay=(0.2, 2.0), rate=None,
                 biz_type="oracle.ok", prefix="burst"):
        super().__init__(name=f"scheduler-{prefix}", daemon=True)
        self.sut_url, self.oracle_dsn, self.total = sut_url, oracle_dsn, total
        self.chunk, self.delay, self.rate, self.biz_type, self.prefix = chunk, delay, rate, biz_type, prefix
        self.committed = self.failed_chunks = 0
        self.job_ids = []
        self.stop = threading.Event()
        self.error = None

    def run(self):
        oracle = Oracle(self.oracle_dsn)  # a connection of this thread's own
        scheduler = Scheduler(self.sut_url, oracle)
        started, n = time.monotonic(), 0
        try:
            while self.committed < self.total and not self.stop.is_set():
                size = min(self.chunk, self.total - self.committed)
                items = [{"biz_type": self.biz_type, "biz_id": f"{self.prefix}{n + i}",
                          "delay": round(random.uniform(*self.delay), 3)} for i in range(size)]
                n += size
                try:
                    self.job_ids += scheduler.schedule_many(items)
                    self.committed += size
                except psycopg.Error:
                    self.failed_chunks += 1  # recorded by the Scheduler (rolled back or unknown)
                    self.stop.wait(0.2)
                    continue
                if self.rate:
                    self.stop.wait(max(0.0, started + self.committed / self.rate - time.monotonic()))
        except Exception as exc:  # noqa: BLE001  the oracle itself failed: the test must not pass
            self.error = exc
        finally:
            scheduler.close()
            oracle.close()

    def join_checked(self, timeout):
        self.join(timeout)
        assert not self.is_alive(), f"the scheduler did not finish in {timeout} s ({self.committed} committed)"
        assert self.error is None, f"the scheduler failed: {self.error!r}"


class BackendKiller(threading.Thread):
    """Every `interval` seconds, terminates the backends of `names` (application names) on `admin_url`."""

    def __init__(self, admin_url, names, *, interval=3.0):
        super().__init__(name="backend-killer", daemon=True)
        self.admin_url, self.names, self.interval = admin_url, list(names), interval
        self.kills = {name: 0 for name in self.names}
        self.seen = {name: set() for name in self.names}
        self.rounds = 0
        self.stop = threading.Event()
        self.error = None

    def run(self):
        try:
            with psycopg.connect(self.admin_url, autocommit=True, application_name="reliability-killer") as conn:
                while not self.stop.wait(self.interval):
                    rows = conn.execute(
                        "SELECT application_name, pid, pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE application_name = ANY(%s)", [self.names]).fetchall()
                    self.rounds += 1
                    for name, pid, terminated in rows:
                        self.seen[name].add(pid)
                        self.kills[name] += int(terminated)
        except Exception as exc:  # noqa: BLE001  reported by finish(): the test must not pass
            self.error = exc

    def finish(self):
        self.stop.set()
        self.join(30)
        assert self.error is None, f"the backend killer failed: {self.error!r}"


class WorkerSupervisor(threading.Thread):
    """Restarts the Celery worker when it exits, as a deployment's process manager would
    (systemd's Restart=always), and counts the restarts.

    Needed for Redis faults: with kombu 5.7's Redis transport, a worker that holds unacknowledged
    messages (acks_late) when the broker goes away dies with "Unrecoverable error: AttributeError
    ('NoneType' object has no attribute 'hostname')": closing its channel tries to restore those
    messages through a transport that was already closed."""

    def __init__(self, system, **worker_kwargs):
        super().__init__(name="worker-supervisor", daemon=True)
        self.system, self.worker_kwargs = system, worker_kwargs
        self.exit_codes = []
        self.stop = threading.Event()
        self.current = self._spawn()

    @property
    def restarts(self):
        return len(self.exit_codes)

    def _spawn(self):
        name = f"worker-restart{self.restarts}" if self.restarts else "worker"
        return self.system.may_exit(self.system.worker(name, **self.worker_kwargs))

    def run(self):
        while not self.stop.wait(0.5):
            if self.current.poll() is not None:
                self.exit_codes.append(self.current.returncode)
                self.system.stop(self.current)  # its process group, if anything is left of it
                self.current = self._spawn()

    def finish(self):
        self.stop.set()
        self.join(30)


class PersistentRedis(ThrowawayRedis):
    """Keeps its data across a stop (appendonly; SHUTDOWN flushes it); `restart_empty()` loses it."""

    def start(self, timeout=30.0):
        args = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes",
                "--appendfsync", "everysec", "--dir", str(self.dir), "--daemonize", "no",
                "--logfile", str(self.dir / "redis.log")]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        start_new_session=True)
        wait_for(lambda: self.ping() or self.process.poll() is not None, timeout, interval=0.05,
                 message=f"redis-server on port {self.port}")
        if self.process.poll() is not None:
            raise RuntimeError(f"redis-server on port {self.port} exited with {self.process.returncode}")

    def stop_keeping_data(self):
        self.stop(signal.SIGTERM)  # SHUTDOWN: the append-only file is complete

    def restart_empty(self):
        """SIGKILL, delete the data, start again: every queued and unacknowledged message is gone."""
        self.stop(signal.SIGKILL)
        for path in self.dir.iterdir():
            if path.name != "redis.log":
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        self.start()

    def message_count(self) -> int:
        import redis

        client = redis.Redis(port=self.port, socket_timeout=5)
        try:
            return queue_length(client) + client.hlen("unacked")
        finally:
            client.close()


class Timeline:
    """Marks on the oracle's clock (the same machine's clock as the system's database) and the numbers
    a scenario observed. `numbers()` prints them and appends them to <log_dir>/numbers.json."""

    def __init__(self, oracle, log_dir, name):
        self.oracle, self.log_dir, self.name = oracle, log_dir, name
        self.started = time.monotonic()
        self.marks = {}
        self.observed = {}

    def mark(self, label):
        self.marks[label] = self.oracle.now()
        return self.marks[label]

    def elapsed(self):
        return round(time.monotonic() - self.started, 1)

    def first_run_after(self, label, timeout):
        """Seconds from the mark to the first handler run recorded after it (waits for one)."""
        since = self.marks[label]

        def first():
            return self.oracle.conn.execute("SELECT min(ran_at) FROM oracle_run WHERE ran_at > %s",
                                            [since]).fetchone()[0]

        ran_at = wait_for(first, timeout, interval=0.1, message=f"a handler run after {label}")
        return round((ran_at - since).total_seconds(), 3)

    def backlog_done_after(self, label):
        """Seconds from the mark until every task due before it had its first run (None if none was
        waiting at the mark)."""
        mark = self.marks[label]
        row = self.oracle.conn.execute(
            "SELECT max(first_run) FROM (SELECT min(ran_at) AS first_run, min(action_time) AS due FROM oracle_run "
            "GROUP BY job_id) AS r WHERE due < %s AND first_run > %s", [mark, mark]).fetchone()
        return None if row[0] is None else round((row[0] - mark).total_seconds(), 3)

    def first_runs_after(self, job_ids, label) -> dict:
        """For the jobs that had not run by the mark: seconds from it to their first runs (min, max)."""
        mark = self.marks[label]
        row = self.oracle.conn.execute(
            "SELECT min(first_run), max(first_run), count(*) FROM (SELECT min(ran_at) AS first_run FROM oracle_run "
            "WHERE job_id = ANY(%s) GROUP BY job_id) AS r WHERE first_run > %s", [list(job_ids), mark]).fetchone()
        if not row[2]:
            return {"jobs": 0}
        return {"jobs": row[2], "min": round((row[0] - mark).total_seconds(), 3),
                "max": round((row[1] - mark).total_seconds(), 3)}

    def lateness(self, report) -> dict:
        values = sorted(report.first_lateness.values())
        if not values:
            return {}
        def pick(q):
            return round(values[min(len(values) - 1, int(q * len(values)))], 3)

        return {"p50": pick(0.5), "p90": pick(0.9), "p99": pick(0.99), "max": round(values[-1], 3)}

    def numbers(self, **observed):
        self.observed.update(observed, duration_s=self.elapsed(), scale=SCALE)
        print(f"\n[{self.name}] " + json.dumps(self.observed, default=str))
        with open(self.log_dir / "numbers.json", "a") as out:
            out.write(json.dumps({"test": self.name, **self.observed}, default=str) + "\n")
        return self.observed
