"""A throwaway PostgreSQL cluster: initdb in a temp dir, started on a free port, that its user may
stop, kill and restart at will, never the shared server. The reliability tests run the system under
test on one; the shard benchmark runs separate servers on several.

    with ThrowawayPostgres() as pg:          # initdb + start + CREATE DATABASE + manage.py migrate
        pg.url                               # postgres://postgres@127.0.0.1:<port>/timeouts
        pg.restart()                         # pg_ctl -m immediate restart (a crash, then recovery)
        pg.stop("fast"); pg.start()
    # always stopped (immediate) and its directory deleted

It needs root (PostgreSQL runs as the `postgres` user, through runuser) and PostgreSQL 15's
binaries; `postgres_available()` says whether this machine has them.
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import psycopg

from .processes import free_port

ROOT = Path(__file__).resolve().parents[1]
PG_BIN = Path(os.environ.get("TIMEOUTS_PG_BIN", "/usr/lib/postgresql/15/bin"))


def postgres_available() -> bool:
    return os.geteuid() == 0 and (PG_BIN / "initdb").exists()


def migrate(url: str, settings_module=None):
    """`manage.py migrate` against the database at `url`, in a child process (Django is already
    set up on the test database in this one)."""
    settings_module = settings_module or os.environ.get("DJANGO_SETTINGS_MODULE", "project.settings")
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
