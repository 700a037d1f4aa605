"""The system under test as real processes: Celery workers, dispatchers and scan loops, each in a
process group of its own, pointed at a database URL, a broker URL and the oracle.

    with System(database_url=pg.url, broker_url=url, oracle_dsn=oracle.dsn, log_dir=path) as system:
        worker = system.worker(concurrency=2)               # celery worker -P prefork -c 2
        system.wait_worker_ready(worker)
        system.dispatcher(faults="claim.after_commit=exit")  # manage.py timeouts_dispatcher
        system.scanner(interval=1)                           # python -m benchmarks.scan_loop
        ... schedule with oracle.Scheduler ...
        system.wait_until_final(timeout=60)                  # every due task DONE, CANCELLED or DEAD
        system.wait_broker_drained(timeout=30)               # no message queued or unacknowledged
    # every process started is stopped (SIGTERM, then SIGKILL, by process group), even on failure

Children get DJANGO_SETTINGS_MODULE=tests.reliability.settings, DATABASE_URL, the broker URL,
TIMEOUTS_ORACLE_DSN, TIMEOUTS_SCAN_INTERVAL, TIMEOUTS_FAULTS (only where `faults=` is given) and
TIMEOUTS_FAULTS_LOG (`system.fault_log`; `system.fired(point)` reads it). Logs go to `log_dir`,
one file per process name; `system.log_count(text)` counts the lines that contain it.
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import psycopg

from tests.support import processes
from tests.support.broker_messages import queue_length
from timeouts.testing import faults as fault_points

ROOT = processes.ROOT
SETTINGS_MODULE = "tests.reliability.settings"
FINAL = (2, 3, 5)  # DONE, CANCELLED, DEAD
HORIZON = 60  # seconds: tasks due later than this are not waited for


class System:
    def __init__(self, *, database_url, broker_url, oracle_dsn, log_dir, scan_interval=1.0, env=None):
        self.database_url, self.broker_url, self.oracle_dsn = database_url, broker_url, oracle_dsn
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.fault_log = self.log_dir / "faults.log"
        self.scan_interval = scan_interval
        self.extra_env = dict(env or {})
        self.running: list[tuple[str, subprocess.Popen]] = []
        self._app = None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.stop_all()
        if self._app is not None:
            self._app.close()

    # -- starting and stopping -----------------------------------------------------------------

    def env(self, faults=None, **extra) -> dict:
        env = {key: value for key, value in os.environ.items() if not key.startswith("TIMEOUTS_FAULTS")}
        env.update({
            "DJANGO_SETTINGS_MODULE": SETTINGS_MODULE, "DATABASE_URL": self.database_url,
            "TIMEOUTS_TEST_BROKER_URL": self.broker_url, "CELERY_BROKER_URL": self.broker_url,
            "TIMEOUTS_ORACLE_DSN": self.oracle_dsn, "TIMEOUTS_SCAN_INTERVAL": str(self.scan_interval),
            "TIMEOUTS_FAULTS_LOG": str(self.fault_log), "TIMEOUTS_LOG_LEVEL": "INFO",
            "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1",
        })
        if faults:
            fault_points.parse(faults)  # fail here, not in a child that would die at start-up
            env["TIMEOUTS_FAULTS"] = faults
        env.update({key: str(value) for key, value in {**self.extra_env, **extra}.items()})
        return env

    def spawn(self, name, args, *, faults=None, env=None) -> subprocess.Popen:
        path = self.log_dir / f"{name}.log"
        with open(path, "ab") as log:  # the child keeps its own descriptor
            log.write(f"=== {time.strftime('%H:%M:%S')} {' '.join(map(str, args))} faults={faults}\n".encode())
            log.flush()
            process = subprocess.Popen(args, env=self.env(faults, **(env or {})), cwd=ROOT, stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True)
        process.name, process.log_path = name, path
        self.running.append((name, process))
        return process

    def worker(self, name="worker", *, concurrency=2, pool="prefork", queues=("celery",), faults=None, env=None):
        args = [sys.executable, "-m", "celery", "-A", "project", "worker", "-P", pool, "-c", str(concurrency),
                "-Q", ",".join(queues), "-n", f"{name}@%h", "--without-gossip", "--without-mingle",
                "--without-heartbeat", "-l", "warning"]
        return self.spawn(name, args, faults=faults, env=env)

    def dispatcher(self, name="dispatcher", *, args=(), faults=None, env=None):
        return self.spawn(name, [sys.executable, "manage.py", "timeouts_dispatcher", *args], faults=faults, env=env)

    def scanner(self, name="scanner", *, interval=None, faults=None, env=None):
        interval = self.scan_interval if interval is None else interval
        return self.spawn(name, [sys.executable, "-m", "benchmarks.scan_loop", "--interval", str(interval)],
                          faults=faults, env=env)

    def kill(self, process_or_pid, sig=signal.SIGKILL):
        """Signal one process (not its group): a worker's main process, or one pool child by pid."""
        pid = getattr(process_or_pid, "pid", process_or_pid)
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, process, timeout=10.0):
        """SIGTERM its process group (orphaned pool children too), then SIGKILL what is left."""
        processes.stop(process, timeout)
        # A main process killed alone leaves its group behind: stop_group skips a reaped leader.
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.running = [(n, p) for n, p in self.running if p is not process]

    def stop_all(self):
        for _name, process in reversed(list(self.running)):
            self.stop(process)

    @staticmethod
    def children(process) -> list[int]:
        """PIDs of a worker's pool processes."""
        try:
            return [child.pid for child in psutil.Process(process.pid).children()]
        except psutil.NoSuchProcess:
            return []

    @staticmethod
    def all_gone(pids) -> bool:
        """Whether every one of these processes has exited (a zombie left to reap counts as gone)."""
        def gone(pid):
            try:
                return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
            except psutil.NoSuchProcess:
                return True
        return all(map(gone, pids))

    # -- the broker ----------------------------------------------------------------------------

    @property
    def app(self):
        """A Celery app of the test's own on the system's broker (pings, queue lengths)."""
        if self._app is None:
            from celery import Celery

            self._app = Celery("reliability-probe", broker=self.broker_url, set_as_current=False)
            self._app.conf.update(task_serializer="json", accept_content=["json"], broker_connection_retry=False)
        return self._app

    def wait_worker_ready(self, process, timeout=60):
        host = f"{process.name}@"

        def ready():
            if process.poll() is not None:
                raise AssertionError(f"worker {process.name} exited with {process.returncode}: {self.tail(process)}")
            return any(name.startswith(host) for reply in self.app.control.ping(timeout=0.5) for name in reply)

        processes.wait_for(ready, timeout, interval=0.2, message=f"worker {process.name} to answer a ping")

    def redis(self):
        import redis

        return redis.Redis.from_url(self.broker_url)

    def broker_backlog(self) -> tuple[int, int]:
        """(messages queued on `celery`, messages delivered but not acknowledged)."""
        client = self.redis()
        try:
            return queue_length(client), client.hlen("unacked")
        finally:
            client.close()

    def unacked(self) -> set:
        """Delivery tags of the messages delivered to some worker and not acknowledged yet."""
        client = self.redis()
        try:
            return set(client.hkeys("unacked"))
        finally:
            client.close()

    def wait_broker_drained(self, timeout=60):
        processes.wait_for(lambda: self.broker_backlog() == (0, 0), timeout, interval=0.2,
                           message="the broker's queue and unacked messages to drain")

    # -- the database --------------------------------------------------------------------------

    def query(self, sql, params=()):
        with psycopg.connect(self.database_url, autocommit=True, connect_timeout=5) as conn:
            return conn.execute(sql, params).fetchall()

    def status_counts(self) -> dict:
        return dict(self.query("SELECT status, count(*) FROM timeouts_task GROUP BY status"))

    def unfinished(self, job_ids=None) -> int:
        """Tasks due within HORIZON seconds that are not DONE, CANCELLED or DEAD yet."""
        sql = (f"SELECT count(*) FROM timeouts_task WHERE status NOT IN {FINAL} "
               f"AND action_time < clock_timestamp() + interval '{HORIZON} seconds'")
        if job_ids is not None:
            return self.query(sql + " AND job_id = ANY(%s)", [list(job_ids)])[0][0]
        return self.query(sql)[0][0]

    def wait_until_final(self, timeout, job_ids=None):
        def final():
            self.check_alive()
            return self.unfinished(job_ids) == 0

        try:
            processes.wait_for(final, timeout, interval=0.2, message="every due task to be final")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; statuses {self.status_counts()}") from None

    # -- logs ----------------------------------------------------------------------------------

    def check_alive(self, names=None):
        """Raise if a process (of those names) died on its own."""
        for name, process in self.running:
            if getattr(process, "may_exit", False):
                continue
            if (names is None or name in names) and process.poll() is not None:
                raise AssertionError(f"{name} (pid {process.pid}) exited with {process.returncode}: "
                                     f"{self.tail(process)}")

    @staticmethod
    def may_exit(process):
        """Mark a process that is meant to die (a fault, a kill): check_alive() ignores it; stop_all()
        still ends its process group."""
        process.may_exit = True
        return process

    def fired(self, point=None) -> list:
        return fault_points.fired(self.fault_log, point)

    def log_count(self, text) -> int:
        """Log lines that contain `text`, in every log. A worker writes each `timeouts` record twice:
        bare, through the Django LOGGING handler, and as "[date: LEVEL/process] ..." through Celery's
        root logger; only the bare copies count."""
        return sum(text in line and not line.startswith("[") for path in self.log_dir.glob("*.log")
                   for line in path.read_text(errors="replace").splitlines())

    @staticmethod
    def tail(process, chars=2000) -> str:
        return Path(process.log_path).read_text(errors="replace")[-chars:]
