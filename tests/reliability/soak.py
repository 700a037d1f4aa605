"""Soak mode: the reliability oracle at a steady rate for a chosen time, with random faults.

    bin/soak --minutes 30                  # or: python -m tests.reliability.soak --minutes 30
    bin/soak --minutes 5 --rate 40 --fault-every 15 --json var/soak.json

Not part of CI. It starts its own PostgreSQL cluster and Redis server (throwaway, free ports), an
oracle database on the shared cluster (`timeouts_soak_oracle`), two prefork workers, two
dispatchers and a scan loop, then for --minutes:

- schedules --rate tasks a second (oracle.ok, due 0-5 s ahead), cancels one in ten of them a moment
  later and reschedules one in twenty (the oracle records every outcome);
- every --fault-every seconds (jittered) injects one fault, at random: kill -9 a worker's pool
  child, kill -9 a worker's main process (then starts it again), kill -9 a dispatcher (and starts
  it again), pg_terminate_backend of every system backend, an immediate (crash) restart of
  PostgreSQL, a restart of Redis without persistence (queued messages gone).

Then it stops the load, lets the system recover, and reports from the oracle: lost, unexpected, ran
after a True cancel, early, stuck, accounting, and duplicate runs per million runs beside their
bound. The bound: a handler that was running when its process died, or whose finish the crashed
database had not yet flushed (finish commits with synchronous_commit off), may run again; so each
fault adds at most the tasks that were RUNNING at that moment, plus, for a database crash, those
that finished in the second before it.
"""

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from timeouts.states import Status

ROOT = Path(__file__).resolve().parents[2]
ORACLE_DB = "timeouts_soak_oracle"
SHARED = os.environ.get("TIMEOUTS_SOAK_SHARED_PG", "postgres://postgres@127.0.0.1:5432")
FAULTS = ("kill_worker_child", "kill_worker_main", "kill_dispatcher", "terminate_backends", "restart_postgres",
          "restart_redis")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--rate", type=float, default=30.0, help="tasks scheduled per second")
    parser.add_argument("--fault-every", type=float, default=30.0, help="mean seconds between faults")
    parser.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated subset of {','.join(FAULTS)}")
    parser.add_argument("--recovery", type=float, default=120.0, help="seconds allowed to settle after the load")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--json", default=str(ROOT / "var" / "soak.json"))
    args = parser.parse_args(argv)
    faults = [name for name in args.faults.split(",") if name]
    unknown = set(faults) - set(FAULTS)
    if unknown:
        parser.error(f"unknown faults: {', '.join(sorted(unknown))}")
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    random.seed(seed)

    from .clusters import ThrowawayPostgres, ThrowawayRedis

    log_dir = Path(tempfile.mkdtemp(prefix="timeouts-soak-"))
    print(f"soak: {args.minutes} min at {args.rate}/s, a fault every ~{args.fault_every} s of {faults}; "
          f"seed {seed}; logs in {log_dir}", flush=True)
    with ThrowawayPostgres() as pg, ThrowawayRedis() as redis_server:
        os.environ.update({"DJANGO_SETTINGS_MODULE": "tests.reliability.settings", "DATABASE_URL": pg.url,
                           "TIMEOUTS_TEST_BROKER_URL": redis_server.url(), "CELERY_BROKER_URL": redis_server.url()})
        import django

        django.setup()
        result = Soak(args, faults, pg, redis_server, log_dir).run()
    result["seed"] = seed
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps(result["summary"], indent=2), flush=True)
    print(f"JSON: {args.json}")
    return 0 if result["summary"]["clean"] else 1


class Soak:
    def __init__(self, args, faults, pg, redis_server, log_dir):
        self.args, self.faults, self.pg, self.redis_server, self.log_dir = args, faults, pg, redis_server, log_dir
        self.stop = threading.Event()
        self.events = []  # (seconds since start, fault, duplicate bound it adds)
        self.load_errors = 0
        self.backlog = []  # tasks overdue by over 10 s, sampled at each fault: did the system keep up?
        self.restarts = {}  # process name -> times it died on its own and was started again
        self.started = time.monotonic()

    def run(self) -> dict:
        import psycopg

        from .oracle import Oracle, Scheduler
        from .system import System

        oracle_dsn = _fresh_database(ORACLE_DB)
        oracle = Oracle(oracle_dsn)
        oracle.create_tables()
        env = {"TIMEOUTS_TEST_VISIBILITY_TIMEOUT": "30", "TIMEOUTS_LOG_LEVEL": "WARNING"}
        with System(database_url=self.pg.url, broker_url=self.redis_server.url(), oracle_dsn=oracle_dsn,
                    log_dir=self.log_dir, scan_interval=2.0, env=env) as system:
            self.system = system
            self.workers = [system.worker(f"worker{i}", concurrency=2) for i in range(2)]
            for worker in self.workers:
                system.wait_worker_ready(worker)
            self.dispatchers = [system.dispatcher(f"dispatcher{i}") for i in range(2)]
            system.scanner()
            load = threading.Thread(target=self._load, args=(Scheduler(self.pg.url, oracle),), name="soak-load")
            load.start()
            try:
                self._inject_faults()
            finally:
                self.stop.set()
                load.join(60)
            settle_started = time.monotonic()
            while system.unfinished() and time.monotonic() - settle_started < self.args.recovery:
                self._supervise()
                time.sleep(1)
            settled = time.monotonic() - settle_started
            if system.unfinished():
                print(f"soak: not settled after {settled:.0f} s: {system.status_counts()}", flush=True)
            from .checker import check

            report = check(self.pg.url, oracle_dsn, recovery_window=self.args.recovery)
        oracle.close()
        with psycopg.connect(_url("postgres"), autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{ORACLE_DB}" WITH (FORCE)')
        return self._result(report, settled)

    # -- the load --------------------------------------------------------------------------------

    def _load(self, scheduler):
        """--rate tasks a second in batches of a tenth of a second; one in ten cancelled and one in
        twenty rescheduled a moment later, through the library's own API (Django's connection)."""
        from django.db import connection

        tick = time.monotonic()
        carry = 0.0
        later = []  # (job_id, "cancel" | "reschedule")
        while not self.stop.is_set():
            carry += self.args.rate / 10
            count, carry = int(carry), carry - int(carry)
            items = [{"biz_type": "oracle.ok", "biz_id": f"soak-{time.monotonic_ns()}-{i}",
                      "delay": random.uniform(0.0, 5.0)} for i in range(count)]
            try:
                if items:
                    for job_id in scheduler.schedule_many(items):
                        draw = random.random()
                        if draw < 0.15:
                            later.append((job_id, "cancel" if draw < 0.1 else "reschedule"))
                while later and random.random() < 0.5:
                    job_id, action = later.pop(0)
                    self._cancel(scheduler.oracle, job_id) if action == "cancel" else self._reschedule(job_id)
            except Exception as exc:  # noqa: BLE001  the database or broker is down: the oracle knows
                self.load_errors += 1
                if self.load_errors % 50 == 1:
                    print(f"soak: load error ({self.load_errors}): {exc!r}", flush=True)
                scheduler.close()
                scheduler.conn = None
                connection.close()
            tick += 0.1
            self.stop.wait(max(0.0, tick - time.monotonic()))

    @staticmethod
    def _cancel(oracle, job_id):
        from timeouts.models import TimeoutTask

        try:
            task = TimeoutTask.objects.filter(job_id=job_id).first()
            result = task.cancel() if task is not None else False
        except Exception:
            oracle.record_cancel(job_id, None)  # unknown: the checker treats it as "may have cancelled"
            raise
        oracle.record_cancel(job_id, result)

    @staticmethod
    def _reschedule(job_id):
        from timeouts.models import TimeoutTask

        task = TimeoutTask.objects.filter(job_id=job_id).first()
        if task is not None:
            task.reschedule(delay=random.uniform(0.0, 5.0))

    # -- the faults ------------------------------------------------------------------------------

    def _inject_faults(self):
        end = self.started + self.args.minutes * 60
        while time.monotonic() < end:
            wait = random.uniform(0.5, 1.5) * self.args.fault_every
            if self.stop.wait(min(wait, max(0.0, end - time.monotonic()))):
                return
            if time.monotonic() >= end or not self.faults:
                return
            self._supervise()
            fault = random.choice(self.faults)
            self.backlog.append(self._overdue())
            bound = self._running_now()
            if fault == "restart_postgres":
                bound += self._finished_in_last_second()
            try:
                getattr(self, fault)()
            except Exception as exc:  # noqa: BLE001  a fault that could not be injected is reported, not fatal
                print(f"soak: {fault} failed: {exc!r}", flush=True)
                bound = 0
            at = round(time.monotonic() - self.started, 1)
            self.events.append((at, fault, bound))
            print(f"soak: {at:7.1f} s  {fault:20s} (duplicate bound +{bound})", flush=True)

    def _supervise(self):
        """Start again any worker or dispatcher that died on its own, as systemd's Restart=always
        would (a kombu 5.7 worker can exit when Redis goes away: README, "Processes to run")."""
        for group, start in ((self.workers, lambda name: self.system.worker(name, concurrency=2)),
                             (self.dispatchers, self.system.dispatcher)):
            for index, process in enumerate(group):
                if process.poll() is not None:
                    self.system.stop(process)
                    group[index] = start(process.name)
                    self.restarts[process.name] = self.restarts.get(process.name, 0) + 1
                    print(f"soak: {process.name} had exited ({process.returncode}); started again", flush=True)

    def kill_worker_child(self):
        worker = random.choice(self.workers)
        children = self.system.children(worker)
        if children:
            self.system.kill(random.choice(children))

    def kill_worker_main(self):
        index = random.randrange(len(self.workers))
        worker = self.workers[index]
        self.system.kill(worker)
        self.system.stop(worker)  # its pool children, by process group
        self.workers[index] = self.system.worker(worker.name, concurrency=2)

    def kill_dispatcher(self):
        index = random.randrange(len(self.dispatchers))
        dispatcher = self.dispatchers[index]
        self.system.kill(dispatcher)
        self.system.stop(dispatcher)
        self.dispatchers[index] = self.system.dispatcher(dispatcher.name)

    def terminate_backends(self):
        self._sut_query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()")

    def restart_postgres(self):
        self.pg.restart("immediate")

    def restart_redis(self):
        self.redis_server.stop()
        self.redis_server.start()

    def _running_now(self) -> int:
        try:
            return self._sut_query("SELECT count(*) FROM timeouts_task WHERE status = %s", [Status.RUNNING])[0][0]
        except Exception:  # noqa: BLE001  the database is down: nothing can be running a start
            return 0

    def _overdue(self) -> int:
        try:
            return self._sut_query("SELECT count(*) FROM timeouts_task WHERE status IN (%s, %s) "
                                   "AND run_at < clock_timestamp() - interval '10 seconds'",
                                   [Status.PENDING, Status.DISPATCHED])[0][0]
        except Exception:  # noqa: BLE001  the database is down
            return 0

    def _finished_in_last_second(self) -> int:
        try:
            return self._sut_query("SELECT count(*) FROM timeouts_task WHERE status = %s "
                                   "AND finished_at > clock_timestamp() - interval '1 second'", [Status.DONE])[0][0]
        except Exception:  # noqa: BLE001
            return 0

    def _sut_query(self, sql, params=()):
        import psycopg

        with psycopg.connect(self.pg.url, autocommit=True, connect_timeout=5) as conn:
            return conn.execute(sql, params).fetchall()

    # -- the result ------------------------------------------------------------------------------

    def _result(self, report, settled) -> dict:
        runs = sum(len(runs) for runs in report.runs_by_job.values())
        bound = sum(bound for _at, _fault, bound in self.events)
        duplicates = report.duplicate_runs
        problems = {name: len(items) for name, items in report.problems().items() if name != "duplicates"}
        summary = {
            "minutes": self.args.minutes, "rate_per_s": self.args.rate, "counts": report.counts,
            "runs": runs, "faults": {name: sum(1 for e in self.events if e[1] == name) for name in self.faults},
            "duplicate_runs": duplicates, "duplicate_bound": bound,
            "duplicates_per_million_runs": round(duplicates * 1e6 / runs, 1) if runs else 0.0,
            "bound_per_million_runs": round(bound * 1e6 / runs, 1) if runs else 0.0,
            "problems": problems, "load_errors": self.load_errors, "settled_seconds": round(settled, 1),
            "restarts_after_dying_alone": self.restarts,
            "max_first_run_lateness_s": round(report.max_lateness(), 3),
            # Overdue tasks sampled before each fault: if this grows, the load is more than the
            # workers can start, and tasks still waiting at the end show up as lost and stuck.
            "overdue_samples_max": max(self.backlog, default=0), "overdue_samples_last": self.backlog[-3:],
        }
        summary["clean"] = not problems and duplicates <= bound
        return {"summary": summary, "events": self.events, "report": str(report)}


def _url(database) -> str:
    return f"{SHARED}/{database}"


def _fresh_database(name) -> str:
    import psycopg

    with psycopg.connect(_url("postgres"), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    return _url(name)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: the context managers stop everything
    sys.exit(main())
