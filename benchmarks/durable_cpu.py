"""durable_cpu: the CPU time a DurableTask call costs, against a plain Celery message of the same body.

N calls of the same body (benchmarks.handlers: one start row each) at a steady rate (--cpu-rate; 0:
as fast as they go), made by a process of their own (benchmarks.calls --hold), to one worker:

- celery_plain: `apply_async(args)`, a message to run now;
- durable: `apply_async(args, countdown=COUNTDOWN)`: a row, which the dispatcher claims and
  publishes as it falls due, and the worker starts, runs and ends, as in durable_spread.

Everything is up and warm before the first call: the worker, the dispatcher, their database
sessions, the calling process and its own. The CPU time (user + system, from /proc, so it does not
depend on how long anything waited) of each group of processes is read from just before the first
call until the last call has run (DurableTask: its outcome recorded), less what the same group
uses idle over as long (read just before, over --cpu-idle-seconds):

    caller          the process making the calls
    worker_main     the Celery worker's main process (its consumer and ETA timer; DurableTask's
                    starts ahead and the leases of calls waiting for a pool process)
    worker_pool     the worker's pool processes (the body, DurableTask's start and outcome)
    dispatcher      the dispatcher (DurableTask only)
    postgres        the PostgreSQL backends of every session on the bench database but the bench's own
                    (split by the process each serves, `postgres_for_<group>_ms`)
    broker          the broker's server (Redis or RabbitMQ on this machine, found by its port)
    postgres_other  the rest of the PostgreSQL server: its background processes (WAL writer,
                    checkpointer, autovacuum) and the sessions of other databases

`total` is the first five: the processes that serve the calls alone. The broker and the rest of
PostgreSQL serve whatever else runs on the machine too, so they are reported beside it.
"""

import sys
import time
from urllib.parse import urlsplit

from timeouts.durable.calls import biz_type_for

from . import cpu, machine
from .handlers import DIRECT_TASK, DURABLE_TASK
from .held_process import HeldProcess
from .progress import Progress
from .workload import wait_until, warm_worker

VARIANTS = ("durable", "celery_plain")
TASKS = {"durable": DURABLE_TASK, "celery_plain": DIRECT_TASK}
# Seconds from a DurableTask call to its due time: due soon (the insert wakes the dispatcher), and
# well after the call returned, so each call goes the usual way, claimed ahead and started ahead.
COUNTDOWN = 1.0
OWN = ("caller", "worker_main", "worker_pool", "dispatcher", "postgres")
CLIENT_ROLES = ("caller", "worker_main", "worker_pool", "dispatcher")  # whom a PostgreSQL session serves
SHARED = ("broker", "postgres_other")
POLL = 0.25  # seconds between the bench's looks: it shares the cores with what it measures
READY_TIMEOUT = 120.0  # seconds for the calling process to set up and warm the path
RESULT_TIMEOUT = 60.0  # seconds for its result, once every call has run
BROKER_PORTS = {"redis": 6379, "rediss": 6379, "amqp": 5672, "amqps": 5671, "pyamqp": 5672}
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "")


def measure(ctx, procs, variant, rep) -> dict:
    cfg = ctx.cfg
    n = cfg.n_durable_cpu
    worker = procs.worker(app=cfg.celery_app, concurrency=cfg.concurrency)
    warm_worker(ctx.app, ctx.conn, count=2 * cfg.concurrency, check=procs.check)
    dispatcher = procs.dispatcher(cfg.dispatcher_args) if variant == "durable" else None
    caller = _caller(ctx, variant, n, probe=2 * cfg.concurrency)
    sessions = Sessions(ctx)
    roles = {"caller": caller.process.pid, "worker_main": worker.pid, "dispatcher": dispatcher and dispatcher.pid}
    try:
        caller.wait_ready(READY_TIMEOUT, procs.check)
        finished, before = _finished(ctx, variant, procs)
        meter = cpu.Meter(groups(ctx, worker, dispatcher, caller.process, sessions))
        idle_s, idle = _idle(meter, cfg.cpu_idle_seconds, procs)
        load = machine.loadavg()[0]
        meter.start()
        began = time.monotonic()
        caller.go()
        _wait_for(finished, before + n, meter, procs, caller, _timeout(cfg, n), f"durable_cpu {variant}")
        busy = meter.stop()
        wall = time.monotonic() - began
        made = caller.result(RESULT_TIMEOUT)
    finally:
        caller.stop()
    out = {"n": n, "wall_s": round(wall, 2), "calls_per_s": round(n / wall, 1), "loadavg_1min": load,
           "idle_s": round(idle_s, 2), "sched_per_s": made["sched_per_s"],
           "sched_behind_ms": made.get("sched_behind_ms"), **_counts(ctx, n),
           "postgres_backends_gone": meter.groups["postgres"].gone() if "postgres" in meter.groups else None,
           "cpu_s": {name: None if s is None else round(s, 3) for name, s in busy.items()},
           "idle_cpu_pct": {name: None if r is None else round(100.0 * r, 3) for name, r in idle.items()}}
    out.update(figures(busy, idle, wall, n))
    out.update(by_client(meter, sessions, roles, n))
    return out


def figures(busy, idle, wall_s, n) -> dict:
    """CPU ms per call of each group, net of idle (`<group>_ms`), the total of the processes that
    serve the calls alone, and the total with the broker."""
    per = cpu.per_call(busy, idle, wall_s, n)
    server, own = per.pop("postgres_server", None), per.get("postgres")
    per["postgres_other"] = None if server is None or own is None else round(server - own, 4)
    out = {f"{name}_ms": value for name, value in per.items()}
    out["total_ms"] = cpu.total(per, OWN)
    out["total_with_broker_ms"] = cpu.total(per, (*OWN, "broker"))
    return out


def groups(ctx, worker, dispatcher, caller, sessions) -> dict:
    out = {"caller": cpu.Tree(caller.pid), "worker_main": cpu.Tree(worker.pid, "self"),
           "worker_pool": cpu.Tree(worker.pid, "children")}
    if dispatcher is not None:
        out["dispatcher"] = cpu.Tree(dispatcher.pid)
    postmaster = _postmaster(ctx.conn)
    if postmaster is not None:
        out["postgres"] = cpu.Tracked(sessions.pids)
        out["postgres_server"] = cpu.Tree(postmaster)
    brokers = broker_pids(ctx.cfg.broker_url)
    if brokers:
        out["broker"] = cpu.Trees(brokers)
    return out


def by_client(meter, sessions, roles, n) -> dict:
    """The PostgreSQL sessions' CPU ms per call by the process each serves (`postgres_for_<role>_ms`,
    idle included: the sessions use next to nothing idle)."""
    tracked = meter.groups.get("postgres")
    if tracked is None:
        return {}
    def role(pid):
        return session_role(*sessions.clients.get(pid, (None, None)), roles)

    ticks = tracked.ticks_by(role)
    out = {f"postgres_for_{name}_ms": cpu.per_call_ms(cpu.seconds(ticks.get(name, 0)), n)
           for name in (*CLIENT_ROLES, "other")}
    out["postgres_sessions"] = [{"backend": pid, "serves": role(pid), "cpu_s": cpu.seconds(used), "gone": gone}
                                for pid, used, gone in tracked.processes()]
    return out


def session_role(client, client_parent, roles) -> str:
    """Which of `roles` ({role: pid}: caller, worker_main, dispatcher) a session's client process
    is, or a pool process of the worker's; else "other"."""
    for role, pid in roles.items():
        if pid is not None and client == pid:
            return role
    if client is not None and client_parent is not None and client_parent == roles.get("worker_main"):
        return "worker_pool"
    return "other"


class Sessions:
    """The sessions on the bench database but the bench's own, and the client process of each (its
    pid and its parent's, found once by the session's client port)."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.clients = {}  # backend pid -> (client pid, its parent's pid), or (None, None)

    def pids(self) -> list[int]:
        rows = self.ctx.conn.execute("SELECT pid, client_port FROM pg_stat_activity WHERE datname = current_database() "
                                     "AND backend_type = 'client backend'").fetchall()
        own = _own_backends(self.ctx)
        rows = [(pid, port) for pid, port in rows if pid not in own]
        new = {pid: port for pid, port in rows if pid not in self.clients}
        if new:
            self.clients.update(client_processes(new))
        return [pid for pid, _ in rows]


def _postmaster(conn):
    """The PostgreSQL server's main process, if it runs on this machine: the parent of this session's."""
    stat = cpu.read_stat(conn.info.backend_pid)
    return None if stat is None else stat.ppid


def client_processes(ports) -> dict:
    """{backend pid: (client pid, its parent's pid)} for {backend pid: the client's TCP port}: the
    process that holds a socket on that port here ((None, None) if none is found)."""
    import psutil

    try:
        holders = {c.laddr.port: c.pid for c in psutil.net_connections(kind="tcp") if c.laddr and c.pid}
    except psutil.Error:
        holders = {}
    out = {}
    for backend, port in ports.items():
        stat = cpu.read_stat(holders[port]) if port in holders else None
        out[backend] = (stat.pid, stat.ppid) if stat else (None, None)
    return out


def _own_backends(ctx) -> set:
    from django.db import connections

    pids = {ctx.conn.info.backend_pid}
    wrapper = connections[ctx.alias] if ctx.alias in connections.settings else None
    if wrapper is not None and wrapper.connection is not None and not wrapper.connection.closed:
        pids.add(wrapper.connection.info.backend_pid)
    return pids


def broker_port(url) -> int | None:
    """The port of a broker on this machine, from its URL; None for one elsewhere."""
    parts = urlsplit(url)
    if (parts.hostname or "") not in LOCAL_HOSTS:
        return None
    return parts.port or BROKER_PORTS.get(parts.scheme.split("+")[0])


def broker_pids(url) -> list[int]:
    """The processes listening on the broker's port."""
    import psutil

    port = broker_port(url)
    if port is None:
        return []
    try:
        listening = psutil.net_connections(kind="inet")
    except psutil.Error:  # not allowed to see other users' sockets
        return []
    return sorted({c.pid for c in listening if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
                   and c.pid})


def _idle(meter, seconds, procs):
    """(seconds read, {group: CPU seconds per second}) with everything up and nothing called."""
    if seconds <= 0:
        return 0.0, {}
    meter.start()
    began = time.monotonic()
    while time.monotonic() - began < seconds:
        procs.check()
        time.sleep(min(POLL, max(0.0, seconds - (time.monotonic() - began))))
        meter.sample()
    busy = meter.stop()
    wall = time.monotonic() - began
    return wall, cpu.idle_rates(busy, wall)


def _finished(ctx, variant, procs):
    """A count that reaches `before + n` once every call has run, and `before`: DurableTask's rows
    with their outcome recorded (the body ran before it), once the probe's are; the start rows of
    the plain messages."""
    if variant == "durable":
        params = (biz_type_for(DURABLE_TASK),)
        rows = "SELECT count(*) FROM timeouts_task WHERE biz_type = %s AND finished_at IS {} NULL"
        wait_until(lambda: ctx.conn.execute(rows.format(""), params).fetchone()[0] == 0, 60, procs.check,
                   "the probe calls' outcomes")
        query = rows.format("NOT")
    else:
        query, params = "SELECT count(*) FROM timeouts_bench_start WHERE job_id >= 0", ()

    def count():
        return ctx.conn.execute(query, params).fetchone()[0]

    return count, count()


def _timeout(cfg, n) -> float:
    return cfg.drain_timeout + (n / cfg.cpu_rate if cfg.cpu_rate else 0.0)


def _wait_for(count, target, meter, procs, caller, timeout, label):
    progress = Progress(f"{label}: ran", target)
    deadline = time.monotonic() + timeout
    while True:
        done = count()
        progress.update(done)
        if done >= target:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"{label}: {done} of {target} calls ran within {timeout:.0f} s")
        procs.check()
        caller.check()
        meter.sample()
        time.sleep(POLL)
    progress.finish(done)


def _counts(ctx, n) -> dict:
    total, distinct = ctx.conn.execute(
        "SELECT count(*), count(DISTINCT job_id) FROM timeouts_bench_start WHERE job_id >= 0").fetchone()
    return {"started": distinct, "missing": n - distinct, "duplicates": total - distinct}


def _caller(ctx, variant, n, *, probe) -> HeldProcess:
    """The process making the calls (benchmarks.calls --hold): set up and warm, then held until
    go(), and alive until stop(), so that its CPU time and its database session's are read over
    the whole run."""
    cfg = ctx.cfg
    args = [sys.executable, "-m", "benchmarks.calls", "--app", cfg.celery_app, "--task", TASKS[variant],
            "--n", str(n), "--countdown", str(COUNTDOWN if variant == "durable" else 0), "--rate",
            str(cfg.cpu_rate), "--probe", str(probe), "--hold"]
    return HeldProcess(args, env=ctx.env, cwd=ctx.cwd, name="benchmarks.calls")
