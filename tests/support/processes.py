"""Start and stop real processes for tests: each in its own session, always stopped by PID."""

import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from benchmarks.processes import free_port, stop_group  # noqa: F401 (free_port: for the tests)
from timeouts.celery import BEAT_QUEUE

ROOT = Path(__file__).resolve().parents[2]


def django_env(**extra) -> dict:
    """Environment for a child process that uses the test databases and the test broker."""
    from django.conf import settings

    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "DATABASE_URL": database_url("default"),
           "TIMEOUTS_TEST_BROKER_URL": settings.CELERY_BROKER_URL, "PYTHONPATH": str(ROOT)}
    for alias in getattr(settings, "SHARD_ALIASES", ()):
        env[f"TIMEOUTS_TEST_{alias.upper()}_URL"] = database_url(alias)
    shards = settings.TIMEOUTS.get("SHARDS")
    if shards:
        env["TIMEOUTS_TEST_SHARDS"] = ",".join(shards)
    env.update({key: str(value) for key, value in extra.items()})
    return env


def database_url(alias) -> str:
    """The URL of a database as this process uses it (the test database, once created)."""
    from django.db import connections

    db = connections[alias].settings_dict
    return f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"


def spawn(args, *, env, log_name) -> subprocess.Popen:
    log_dir = ROOT / "var" / "test-logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / f"{log_name}.log", "ab") as log:  # the child keeps its own descriptor
        return subprocess.Popen(args, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


# The file a worker creates once it consumes (tests/testapp/tasks.py, on Celery's worker_ready).
READY_FILE = "TIMEOUTS_TEST_WORKER_READY"

# What a worker of the test project consumes: the default queue, the queue timeouts.celery.setup()
# routes the beat tasks (timeouts.scan, timeouts.maintain) to, and the queue of tests/testapp's
# "test.queued" handler.
WORKER_QUEUES = ("celery", BEAT_QUEUE, "timeouts-test-other")


def celery_worker(*, env, name="worker", concurrency=2, queues=WORKER_QUEUES, pool="prefork"):
    """A worker process; wait_for_worker() waits until it consumes."""
    args = [sys.executable, "-m", "celery", "-A", "project", "worker", "-P", pool, "-c", str(concurrency),
            "-Q", ",".join(queues), "-n", f"{name}@%h", "--without-gossip", "--without-mingle",
            "--without-heartbeat", "-l", "warning"]
    ready = Path(tempfile.mkdtemp(prefix="worker-ready-")) / "ready"
    process = spawn(args, env={**env, READY_FILE: str(ready)}, log_name=name)
    process.ready_file = ready
    return process


def stop(process: subprocess.Popen, timeout=10.0):
    """SIGTERM the process group, then SIGKILL whatever is left."""
    stop_group(process, timeout)


def wait_for(predicate, timeout, interval=0.05, message="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message}")


def wait_for_worker(process, message="the Celery worker", timeout=30):
    """Until the worker `process` consumes from the broker: tests/testapp's worker_ready receiver
    creates its READY_FILE (at once, where a ping's answer would take up to half a second)."""
    wait_for(lambda: process.ready_file.exists() or process.poll() is not None, timeout, message=message)
    assert process.poll() is None, f"{message} exited with {process.returncode}"


@contextmanager
def running_worker(*, env, **options):
    """A Celery worker (`celery_worker`), once it consumes; stopped when the block ends."""
    process = celery_worker(env=env, **options)
    try:
        wait_for_worker(process)
        yield process
    finally:
        stop(process)


@contextmanager
def scanning(interval):
    """The safety scan in a thread of this process, every `interval` seconds (as beat would run it,
    only faster), until the block ends."""
    from django.db import connections

    from timeouts.dispatch.scan import scan

    stop = threading.Event()

    def keep_scanning():
        try:
            while not stop.is_set():
                scan()
                time.sleep(interval)
        finally:
            connections.close_all()  # this thread's, to every shard it scanned

    scanner = threading.Thread(target=keep_scanning)
    scanner.start()
    try:
        yield
    finally:
        stop.set()
        scanner.join(30)


@contextmanager
def admin_server(*, log_name, **env):
    """runserver on the test database (with `env` over the Django environment) in its own process
    group, answering its login page; yields its base URL and stops it by PID."""
    port = free_port()
    args = [sys.executable, "manage.py", "runserver", "--noreload", "--skip-checks", f"127.0.0.1:{port}"]
    process = spawn(args, env=django_env(DJANGO_DEBUG="1", **env), log_name=log_name)
    base = f"http://127.0.0.1:{port}"

    def answering():
        if process.poll() is not None:
            raise AssertionError(f"runserver exited with {process.returncode}: see var/test-logs/")
        try:
            with urllib.request.urlopen(f"{base}/admin/login/", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    try:
        wait_for(answering, timeout=30, interval=0.2, message="runserver")
        yield base
    finally:
        stop(process)
