"""The processes of a run, each in a session of its own, always stopped by PID (in `finally`).

- the Celery worker: `celery -A <app> worker -P prefork -c 2 --include benchmarks.handlers`
- the dispatcher: `python -m django timeouts_dispatcher` (the management command, as deployed)
- the scan loop: `python -m benchmarks.scan_loop`, what beat does: `scan()` every SCAN_INTERVAL
"""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from .database import BenchError


def stop_group(process: subprocess.Popen, timeout=15.0):
    """SIGTERM the child's process group (its PID: it was started in a session of its own), then
    SIGKILL whatever is left."""
    if process.poll() is not None:
        return
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def child_env(*, settings_module, database_url, broker_url, root) -> dict:
    env = dict(os.environ)
    env.update({
        "DJANGO_SETTINGS_MODULE": settings_module,
        "DATABASE_URL": database_url,
        "CELERY_BROKER_URL": broker_url,
        "TIMEOUTS_TEST_BROKER_URL": broker_url,  # the test settings read this one
        "PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p),
        "PYTHONUNBUFFERED": "1",
    })
    # The demo project reads this one: measure without DEBUG's per-query bookkeeping, as production
    # runs (unless the caller asked for DEBUG).
    env.setdefault("DJANGO_DEBUG", "0")
    return env


def dispatcher_available() -> bool:
    from django.core.management import get_commands

    return "timeouts_dispatcher" in get_commands()


def flush_broker(url):
    """Empty the bench's own Redis database (only that logical database)."""
    import redis

    client = redis.Redis.from_url(url)
    try:
        client.flushdb()
    finally:
        client.close()


class Processes:
    """Starts the children of a run and remembers them, so `stop_all()` can end every one."""

    def __init__(self, *, env, cwd, log_dir: Path, label=""):
        self.env, self.cwd, self.log_dir, self.label = env, cwd, Path(log_dir), label
        self.running: list[tuple[str, subprocess.Popen]] = []

    def _spawn(self, name, args) -> subprocess.Popen:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        path = self.log_dir / f"{name}.log"
        with open(path, "ab") as log:  # the child keeps its own descriptor
            log.write(f"\n=== {time.strftime('%H:%M:%S')} {self.label}: {' '.join(args)}\n".encode())
            log.flush()
            process = subprocess.Popen(args, env=self.env, cwd=self.cwd, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        process.log_path = path
        self.running.append((name, process))
        return process

    def worker(self, *, app, concurrency):
        return self._spawn("worker", [
            sys.executable, "-m", "celery", "-A", app, "worker", "-P", "prefork", "-c", str(concurrency),
            "--include", "benchmarks.handlers", "-n", f"timeouts-bench-{os.getpid()}@%h",
            "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "warning",
        ])

    def dispatcher(self, extra_args=()):
        return self._spawn("dispatcher", [sys.executable, "-m", "django", "timeouts_dispatcher", *extra_args])

    def scan_loop(self, *, interval):
        return self._spawn("scan_loop", [sys.executable, "-m", "benchmarks.scan_loop", "--interval", str(interval)])

    def check(self):
        """Raise if a child died on its own (with the end of its log)."""
        for name, process in self.running:
            if process.poll() is not None:
                tail = Path(process.log_path).read_text(errors="replace")[-1500:]
                raise BenchError(f"the {name} process (pid {process.pid}) exited with {process.returncode}:\n{tail}")

    def stop(self, process, timeout=15.0):
        self.running = [(n, p) for n, p in self.running if p is not process]
        stop_group(process, timeout)

    def stop_all(self):
        for _name, process in reversed(list(self.running)):
            self.stop(process)


def free_port() -> int:
    """A TCP port nothing listens on now, on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
