"""`bin/demo --smoke` end to end: worker, beat and web server on a database and broker of its own;
its demo orders must be closed by their handler on time, the paid ones' timeouts cancelled."""

import os
import re
import signal
import subprocess
import sys
from urllib.parse import urlsplit

import psycopg
import pytest
from django.conf import settings
from psycopg import sql

from tests.support.processes import ROOT, free_port


def _smoke_db() -> str:
    """The demo's database, named after this run's test database: two runs at once (each on a test
    database of its own) do not share it, and a run killed before dropping it leaves one that the
    next run on the same test database drops first."""
    return f"{settings.DATABASES['default']['TEST']['NAME']}_demo_smoke"


def _admin_connection():
    db = settings.DATABASES["default"]
    return psycopg.connect(
        host=db["HOST"] or "127.0.0.1", port=db["PORT"] or 5432, user=db["USER"], password=db["PASSWORD"] or None,
        dbname="postgres", autocommit=True,
    )


def _drop(conn, name):
    conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def smoke_database():
    db, name = settings.DATABASES["default"], _smoke_db()
    with _admin_connection() as conn:
        _drop(conn, name)
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    password = f":{db['PASSWORD']}" if db["PASSWORD"] else ""
    yield f"postgres://{db['USER']}{password}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{name}"
    with _admin_connection() as conn:
        _drop(conn, name)


@pytest.fixture
def smoke_broker(tmp_path):
    """A broker of its own: another Redis database than the tests' (emptied before and after), or a
    folder of its own with the filesystem transport."""
    url = os.environ.get("TIMEOUTS_DEMO_SMOKE_BROKER_URL")
    test_url = settings.CELERY_BROKER_URL
    extra = {}
    if not url:
        parts = urlsplit(test_url)
        if parts.scheme in ("redis", "rediss"):
            number = 12 if parts.path.strip("/") != "12" else 11
            url = parts._replace(path=f"/{number}").geturl()
        else:
            url = test_url
            extra["TIMEOUTS_BROKER_FOLDER"] = str(tmp_path / "broker")
    if url.startswith(("redis://", "rediss://")):
        import redis

        client = redis.Redis.from_url(url)
        client.flushdb()
        yield url, extra
        client.flushdb()
    else:
        yield url, extra


def _run_demo_smoke(env, tmp_path):
    """Runs `bin/demo --smoke` with ENV; returns its output once it passed."""
    demo = subprocess.Popen(
        [str(ROOT / "bin" / "demo"), "--smoke"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    try:
        output, _ = demo.communicate(timeout=100)
    except subprocess.TimeoutExpired:
        # bin/demo's trap stops the worker, beat and web server it started, by PID.
        os.killpg(demo.pid, signal.SIGTERM)
        try:
            output, _ = demo.communicate(timeout=25)
        except subprocess.TimeoutExpired:
            os.killpg(demo.pid, signal.SIGKILL)
            output, _ = demo.communicate()
        pytest.fail(f"bin/demo --smoke did not finish in 100 s:\n{output}")
    logs = "".join(
        f"\n--- {path.name} (end) ---\n" + "".join(path.read_text(errors="replace").splitlines(True)[-30:])
        for path in sorted((tmp_path / "demo").glob("*.log"))
    )
    assert demo.returncode == 0, f"bin/demo --smoke exited {demo.returncode}:\n{output}{logs}"
    assert "Demo check passed" in output, output
    assert output.count("FIRED") == 4 and "cancelled  order" in output, output
    return output


def _demo_env(tmp_path, **values):
    drop = ("DJANGO_SETTINGS_MODULE", "TIMEOUTS_TEST_DB", "CELERY_BROKER_URL", "TIMEOUTS_BROKER_FOLDER")
    env = {key: value for key, value in os.environ.items() if key not in drop}
    env.update(TIMEOUTS_PYTHON=sys.executable, TIMEOUTS_DEMO_PORT=str(free_port()),
               TIMEOUTS_DEMO_VAR=str(tmp_path / "demo"), **values)
    return env


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_demo_smoke(smoke_database, smoke_broker, tmp_path):
    broker_url, extra = smoke_broker
    _run_demo_smoke(_demo_env(tmp_path, DATABASE_URL=smoke_database, CELERY_BROKER_URL=broker_url, **extra), tmp_path)


def _alive(pid):
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.timeout(150)
@pytest.mark.one_leg  # the broker's fallbacks: the plain smoke test covers each Django
@pytest.mark.parametrize("fallback", ["valkey", "filesystem"])
def test_demo_smoke_without_redis(smoke_database, tmp_path, fallback):
    """No Redis answers: bin/demo brings its own broker (an embedded Valkey, else kombu's filesystem
    transport), and the timeouts still start within milliseconds. Half a second late is what a
    worker whose ETA timer sleeps a second at a time shows: the bound keeps well above scheduling noise."""
    env = _demo_env(tmp_path, DATABASE_URL=smoke_database, TIMEOUTS_REDIS_PROBE="127.0.0.1:1")
    if fallback == "valkey":
        env["TIMEOUTS_VALKEY_DIR"] = str(tmp_path / "valkey")  # a server of its own, stopped by bin/demo
    else:
        env.update(TIMEOUTS_EMBEDDED_VALKEY="0", TIMEOUTS_BROKER_FOLDER=str(tmp_path / "broker"))
    output = _run_demo_smoke(env, tmp_path)

    if fallback == "valkey":
        assert "Starting the embedded Valkey" in output, output
        log = (tmp_path / "valkey" / "valkey.log").read_text()
        pid = int(re.search(r"^(\d+):M .*Ready to accept connections", log, re.MULTILINE).group(1))
        assert not _alive(pid), f"the embedded Valkey (pid {pid}) outlived bin/demo"
    else:
        assert "filesystem:// transport" in output and "embedded Valkey" not in output, output
    median = float(re.search(r"lateness min \d+ ms, median (\d+) ms", output).group(1))
    assert median < 200, output
