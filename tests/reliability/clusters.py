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

PostgreSQL needs root (it runs as the `postgres` user, through runuser) and PostgreSQL 15's binaries;
`postgres_available()` says whether this machine has them, for a pytest.skip.
"""

import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

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
