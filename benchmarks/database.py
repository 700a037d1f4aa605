"""The bench's own database: created on the developer's server, migrated, used, then dropped.

The bench never touches the database of the `default` alias: it reaches its own database through a
Django alias of its own (for the ORM API under test) and through plain psycopg connections (for the
raw baselines, the start table and the statistics). Child processes get it as DATABASE_URL.
"""

import copy
import subprocess
import sys
from urllib.parse import quote

import psycopg
from django.db import connections

from .handlers import START_TABLE_SQL

ALIAS = "timeouts_bench"
MAINTENANCE_DB = "postgres"


class BenchError(Exception):
    """The bench cannot run as asked; the message says why."""


class BenchDatabase:
    def __init__(self, name: str):
        self.base = connections["default"].settings_dict  # read only, never opened
        if not name or name == self.base["NAME"]:
            raise BenchError(f"the bench needs a database of its own, not {name!r} (the default database)")
        if "postgresql" not in self.base["ENGINE"]:
            raise BenchError(f"the bench needs PostgreSQL, the default database uses {self.base['ENGINE']}")
        self.name = name

    def params(self, dbname=None) -> dict:
        b = self.base
        out = {"dbname": dbname or self.name, "host": b.get("HOST") or None, "port": b.get("PORT") or None,
               "user": b.get("USER") or None, "password": b.get("PASSWORD") or None}
        return {k: v for k, v in out.items() if v is not None}

    def url(self) -> str:
        """DATABASE_URL for child processes (the host project's settings read it)."""
        b = self.base
        auth = quote(b.get("USER") or "", safe="")
        if b.get("PASSWORD"):
            auth += ":" + quote(b["PASSWORD"], safe="")
        host = b.get("HOST") or "127.0.0.1"
        port = f":{b['PORT']}" if b.get("PORT") else ""
        return f"postgres://{auth + '@' if auth else ''}{host}{port}/{self.name}"

    def connect(self, dbname=None) -> psycopg.Connection:
        return psycopg.connect(**self.params(dbname), autocommit=True)

    def admin(self) -> psycopg.Connection:
        """A connection to the server's maintenance database (for CREATE/DROP and server-wide views)."""
        return self.connect(MAINTENANCE_DB)

    def create(self) -> bool:
        """Create the database if it does not exist; True if it was created."""
        with self.admin() as conn:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (self.name,)).fetchone():
                return False
            conn.execute(f'CREATE DATABASE "{self.name}"')
            return True

    def migrate(self, env: dict, cwd):
        """`migrate` in a child process with DATABASE_URL set, as a deployment would run it."""
        done = subprocess.run([sys.executable, "-m", "django", "migrate", "--noinput", "-v", "0"],
                              check=False, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise BenchError(f"migrating {self.name} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        with self.connect() as conn:
            conn.execute(START_TABLE_SQL)

    def drop(self):
        with self.admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')

    # The Django alias through which the bench calls the ORM API (schedule(), bulk_schedule()).
    def install_alias(self):
        connections.settings[ALIAS] = {**copy.deepcopy(self.base), "NAME": self.name}
        return ALIAS

    def remove_alias(self):
        if ALIAS in connections.settings:
            connections[ALIAS].close()
            del connections[ALIAS]
            del connections.settings[ALIAS]


def reset(conn):
    """Empty the task table and the start table between runs (no process of the bench is running)."""
    conn.execute("TRUNCATE timeouts_task, timeouts_bench_start")

