"""Idle cost: N tasks due in an hour, nothing due now; what does a waiting process cost?

Queries/s are counted exactly: `log_statement = 'all'` is switched on for the bench's own database
only (ALTER DATABASE, reset afterwards; it applies to sessions opened later), and the statements
logged for that database over the window are counted. Only the measured process connects to it
after the switch (no worker runs; the bench's own sessions are older and are excluded by PID
anyway). BEGIN/COMMIT/ROLLBACK are counted as round trips but not as queries. Also reported: transactions/s
of the database (pg_stat_database, read from the maintenance database) and CPU of the process tree
(user + system time / wall time; 100 = one core).
"""

import re
import time
from datetime import timedelta
from pathlib import Path

import psycopg

from .database import reset
from .processes import Processes
from .progress import note
from .workload import db_now, schedule_bulk

LINE = re.compile(rb"\[(\d+)\].*?@(\S+) LOG:  (statement|execute [^:]*): ?(.*)")
TRANSACTION_CONTROL = {b"BEGIN", b"COMMIT", b"ROLLBACK", b"START TRANSACTION", b"END"}


def run(ctx, path, rep) -> dict:
    cfg = ctx.cfg
    reset(ctx.conn)
    base = db_now(ctx.conn) + timedelta(hours=1)
    if cfg.n_idle:
        schedule_bulk(ctx.alias, [base + timedelta(milliseconds=i) for i in range(cfg.n_idle)], chunk=cfg.bulk_chunk)
    ctx.conn.execute("VACUUM ANALYZE timeouts_task")  # keeps autovacuum out of the window
    procs = Processes(env=ctx.env, cwd=ctx.cwd, log_dir=ctx.log_dir, label=f"idle/{path}/rep{rep + 1}")
    logging_on = _statement_logging(ctx, True)
    try:
        if path == "dispatcher":
            process = procs.dispatcher(cfg.dispatcher_args)
        else:
            process = procs.scan_loop(interval=cfg.scan_interval)
        note(f"idle {path}: settling {cfg.idle_settle:.0f} s, then measuring {cfg.idle_seconds:.0f} s")
        _sleep(cfg.idle_settle, procs)
        out = measure(ctx, process, procs, logging_on)
    finally:
        procs.stop_all()
        if logging_on:
            _statement_logging(ctx, False)
    out["n"] = cfg.n_idle
    return out


def measure(ctx, process, procs, logging_on) -> dict:
    cfg = ctx.cfg
    log = Path(ctx.pg_log) if (logging_on and ctx.pg_log) else None
    with ctx.db.admin() as admin:
        cpu0, xacts0, size0, t0 = _cpu(process.pid), _xacts(admin, ctx.db.name), _size(log), time.monotonic()
        _sleep(cfg.idle_seconds, procs)
        cpu1, xacts1, size1 = _cpu(process.pid), _xacts(admin, ctx.db.name), _size(log)
        seconds = time.monotonic() - t0
    out = {
        "idle_xacts_per_s": round((xacts1 - xacts0) / seconds, 2),
        "idle_cpu_pct": round((cpu1 - cpu0) / seconds * 100.0, 2),
        "rss_mb": _rss_mb(process.pid),
    }
    if log is not None and size0 is not None and size1 is not None:
        queries, trips = count_statements(log, size0, size1, ctx.db.name, exclude=_own_backends(ctx))
        out.update(idle_qps=round(queries / seconds, 2), idle_round_trips_per_s=round(trips / seconds, 2),
                   idle_metric="statements in the server log")
    else:
        out.update(idle_qps=out["idle_xacts_per_s"], idle_metric="transactions/s (pg_stat_database)")
    return out


def count_statements(log: Path, start, end, dbname, exclude=()):
    """(queries, round trips) logged for the database between two offsets of the server log."""
    with open(log, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    queries = trips = 0
    excluded = {str(p).encode() for p in exclude}
    for line in data.splitlines():
        m = LINE.search(line)
        if not m or m.group(2) != dbname.encode() or m.group(1) in excluded:
            continue
        trips += 1
        if m.group(4).strip().rstrip(b";").upper() not in TRANSACTION_CONTROL:
            queries += 1
    return queries, trips


def _statement_logging(ctx, on) -> bool:
    """Turn statement logging on (new sessions) for the bench database; False if not possible."""
    if not ctx.pg_log:
        return False
    try:
        with ctx.db.admin() as admin:
            verb = "SET log_statement = 'all'" if on else "RESET log_statement"
            admin.execute(f'ALTER DATABASE "{ctx.db.name}" {verb}')
        return True
    except psycopg.Error as exc:  # not a superuser, for instance: fall back to pg_stat_database
        note(f"idle: cannot switch statement logging ({exc}); counting transactions instead")
        return False


def _own_backends(ctx):
    from django.db import connections

    pids = [ctx.conn.info.backend_pid]
    django_conn = connections[ctx.alias].connection
    if django_conn is not None and not django_conn.closed:
        pids.append(django_conn.info.backend_pid)
    return pids


def _xacts(admin, dbname):
    row = admin.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s",
                        (dbname,)).fetchone()
    return row[0] if row else 0


def _cpu(pid) -> float:
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def _rss_mb(pid):
    import psutil

    try:
        root = psutil.Process(pid)
        return round(sum(p.memory_info().rss for p in [root, *root.children(recursive=True)]) / 2**20, 1)
    except psutil.NoSuchProcess:
        return None


def _size(path):
    try:
        return path.stat().st_size if path else None
    except OSError:
        return None


def _sleep(seconds, procs):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        procs.check()
        time.sleep(min(0.5, max(0.0, end - time.monotonic())))


def find_pg_log(conn, configured=""):
    """The server log file, if this process can read it: the option, pg_current_logfile(), or the
    Debian default for the server's major version."""
    candidates = [configured] if configured else []
    try:
        current = conn.execute("SELECT pg_current_logfile()").fetchone()[0]
        if current:
            data_dir = conn.execute("SHOW data_directory").fetchone()[0]
            candidates.append(current if current.startswith("/") else f"{data_dir}/{current}")
    except psycopg.Error:  # an old server, or no rights: try the usual place
        pass
    major = conn.execute("SHOW server_version_num").fetchone()[0][:-4]
    candidates.append(f"/var/log/postgresql/postgresql-{major}-main.log")
    for candidate in candidates:
        try:
            with open(candidate, "rb"):
                return candidate
        except OSError:
            continue
    return ""
