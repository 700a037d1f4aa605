"""Throwaway servers for the system under test: a PostgreSQL cluster (benchmarks/clusters.py, which
the shard benchmark shares) and a Redis server of their own, on free ports, in temp dirs, that a
test may stop, kill and restart at will (never the shared ones).

    with ThrowawayPostgres() as pg:          # initdb + start + CREATE DATABASE + manage.py migrate
        pg.url                               # postgres://postgres@127.0.0.1:<port>/timeouts
        pg.restart()                         # pg_ctl -m immediate restart (a crash, then recovery)
        pg.stop("fast"); pg.start()
    # always stopped (immediate) and its directory deleted, even if the test failed

    with ThrowawayRedis() as redis_server:   # redis-server, no persistence
        redis_server.url(db=0)               # redis://127.0.0.1:<port>/0
        redis_server.restart()               # SIGKILL, then start again on the same port (empty)

    template = PostgresTemplate()            # a migrated cluster's data directory, made once
    with CopiedPostgres(template) as pg:     # a copy of it, started: as ThrowawayPostgres, without
        ...                                  # initdb and migrate for each scenario
    template.destroy()

PostgreSQL needs root (it runs as the `postgres` user, through runuser) and PostgreSQL 15's binaries;
`postgres_available()` says whether this machine has them, for a pytest.skip.
"""

import shutil
import signal
import subprocess
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import psycopg

from benchmarks.clusters import PG_BIN, ThrowawayPostgres, migrate, postgres_available  # noqa: F401
from tests.support.processes import free_port

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def redis_available() -> bool:
    return Path(REDIS_SERVER).exists()


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


class PostgresTemplate:
    """The data directory of a cluster as ThrowawayPostgres leaves it (initdb, the `timeouts` database,
    migrated), stopped cleanly, made at the first copy and copied for each scenario: initdb and
    migrate take seconds, a copy a fraction of one. The migration creates the partitions of the
    current bucket and the buckets ahead: a template of an earlier bucket is made again."""

    def __init__(self):
        self.dir = None
        self.bucket = None

    def copy_to(self, data: Path):
        """Copy the template's data directory to `data` (which must not exist), owner and modes kept."""
        bucket = _current_bucket()
        if self.dir is None or bucket != self.bucket:
            self.destroy()
            self._make()
            self.bucket = bucket
        subprocess.run(["cp", "-a", str(self.dir / "data"), str(data)], check=True, capture_output=True, timeout=120)

    def _make(self):
        self.dir = Path(tempfile.mkdtemp(prefix="timeouts-pg-template-"))
        with ThrowawayPostgres() as cluster:
            cluster.stop("fast")  # a clean shutdown: a copy starts without recovery
            subprocess.run(["cp", "-a", str(cluster.data), str(self.dir / "data")], check=True, capture_output=True,
                           timeout=120)

    def destroy(self):
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


class CopiedPostgres(ThrowawayPostgres):
    """A ThrowawayPostgres started from a copy of a PostgresTemplate: the same cluster, database and
    schema, on a port and in a temp dir of its own; stopped and deleted at exit like any other."""

    def __init__(self, template: PostgresTemplate, *, extra_sql=()):
        super().__init__(extra_sql=extra_sql)
        self.template = template

    def create(self):
        self.base = Path(tempfile.mkdtemp(prefix="timeouts-pg-"))
        shutil.chown(self.base, "postgres", "postgres")
        self.data, self.port = self.base / "data", free_port()
        self.template.copy_to(self.data)
        self.start()
        if self.extra_sql:
            with psycopg.connect(self.url, autocommit=True) as conn:
                for sql in self.extra_sql:
                    conn.execute(sql)


def _current_bucket():
    from timeouts.conf import get_settings
    from timeouts.storage.partitions import bucket_start

    return bucket_start(datetime.now(UTC), get_settings().PARTITION_INTERVAL)
