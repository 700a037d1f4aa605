"""Throwaway servers for the system under test: a PostgreSQL cluster and a Redis server of their own,
on free ports, in temp dirs, that a test may stop, kill and restart at will (never the shared ones).

    with ThrowawayPostgres() as pg:          # initdb + start + CREATE DATABASE + manage.py migrate
        pg.url                               # postgres://postgres@127.0.0.1:<port>/timeouts
        pg.restart()                         # pg_ctl -m immediate restart (a crash, then recovery)
        pg.stop("fast"); pg.start()
    # always stopped (immediate) and its directory deleted, even if the test failed

    with ThrowawayRedis() as redis_server:   # redis-server, no persistence
        redis_server.url(db=0)               # redis://127.0.0.1:<port>/0
        redis_server.restart()               # SIGKILL, then start again on the same port (empty)

PostgreSQL needs root (it runs as the `postgres` user, through runuser) and PostgreSQL 15's binaries;
`postgres_available()` says whether this machine has them, for a pytest.skip.
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

from tests.processes import free_port

ROOT = Path(__file__).resolve().parents[2]
PG_BIN = Path(os.environ.get("TIMEOUTS_PG_BIN", "/usr/lib/postgresql/15/bin"))
REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def postgres_available() -> bool:
    return os.geteuid() == 0 and (PG_BIN / "initdb").exists()


def redis_available() -> bool:
    return Path(REDIS_SERVER).exists()


def migrate(url: str, settings_module="tests.settings"):
    """`manage.py migrate` against the database at `url`, in a child process (Django is already
    set up on the test database in this one)."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": settings_module, "DATABASE_URL": url, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "manage.py", "migrate", "-v", "0"], env=env, cwd=ROOT, check=True, timeout=180)


class ThrowawayPostgres:
    """A PostgreSQL cluster of its own. `extra_sql` runs in the new database after migrating."""

    def __init__(self, *, database="timeouts", migrate_schema=True, extra_sql=(), settings=("-c", "fsync=off")):
        self.database, self.migrate_schema, self.extra_sql = database, migrate_schema, tuple(extra_sql)
        self.settings = settings
        self.base = self.data = None
        self.port = None

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{self.database}"

    @property
    def admin_url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    def __enter__(self):
        try:
            self.create()
        except BaseException:
            self.destroy()
            raise
        return self

    def __exit__(self, *exc_info):
        self.destroy()

    def create(self):
        self.base = Path(tempfile.mkdtemp(prefix="timeouts-pg-"))
        shutil.chown(self.base, "postgres", "postgres")
        self.data, self.port = self.base / "data", free_port()
        _as_postgres(PG_BIN / "initdb", "-D", self.data, "-A", "trust", "-U", "postgres", "-E", "UTF8",
                     "--no-sync", "--no-instructions")
        self.start()
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.database}"')
        if self.migrate_schema:
            migrate(self.url)
        if self.extra_sql:
            with psycopg.connect(self.url, autocommit=True) as conn:
                for sql in self.extra_sql:
                    conn.execute(sql)

    def _pg_ctl(self, *args, check=True):
        options = " ".join([f"-p {self.port}", f"-k {self.base}", "-c listen_addresses=127.0.0.1", *self.settings])
        return _as_postgres(PG_BIN / "pg_ctl", "-D", self.data, "-l", self.base / "server.log", "-w", "-t", "60",
                            "-o", options, *args, check=check)

    def start(self):
        self._pg_ctl("start")

    def stop(self, mode="fast"):
        """`fast`: disconnect clients, checkpoint; `immediate`: like a crash (recovery at the next start)."""
        self._pg_ctl("-m", mode, "stop")

    def restart(self, mode="immediate"):
        self._pg_ctl("-m", mode, "restart")

    def is_running(self) -> bool:
        return self._pg_ctl("status", check=False).returncode == 0

    def destroy(self):
        if self.data is not None and (self.data / "postmaster.pid").exists():
            self._pg_ctl("-m", "immediate", "stop", check=False)
        if self.base is not None:
            shutil.rmtree(self.base, ignore_errors=True)

    def log_tail(self, chars=3000) -> str:
        path = self.base / "server.log" if self.base else None
        return path.read_text(errors="replace")[-chars:] if path and path.exists() else ""


def _as_postgres(*args, check=True):
    return subprocess.run(["runuser", "-u", "postgres", "--", *map(str, args)], check=check, capture_output=True,
                          timeout=120)


class ThrowawayRedis:
    """A redis-server of its own: no RDB/AOF, its --dir in a temp dir, always killed at exit."""

    def __init__(self):
        self.port = free_port()
        self.dir = None
        self.process = None

    def url(self, db=0) -> str:
        return f"redis://127.0.0.1:{self.port}/{db}"

    def __enter__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="timeouts-redis-"))
        try:
            self.start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc_info):
        self.stop()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)

    def start(self, timeout=30.0):
        args = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                "--dir", str(self.dir), "--daemonize", "no", "--logfile", str(self.dir / "redis.log")]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        start_new_session=True)
        deadline = time.monotonic() + timeout
        while not self.ping():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {self.port} did not start")
            time.sleep(0.05)

    def ping(self) -> bool:
        import redis

        try:
            client = redis.Redis(port=self.port, socket_timeout=1, socket_connect_timeout=1)
            try:
                return bool(client.ping())
            finally:
                client.close()
        except redis.RedisError:
            return False

    def stop(self, sig=signal.SIGKILL):
        """SIGKILL by default: nothing is saved anyway, and a broker that dies is the point."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(sig)
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)

    def restart(self, sig=signal.SIGKILL):
        self.stop(sig)
        self.start()
