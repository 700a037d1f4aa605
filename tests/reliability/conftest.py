"""Fixtures of the reliability scenarios.

- `oracle_dsn` (session): the oracle's own database on the shared cluster (the test database's
  server), named `<TIMEOUTS_TEST_DB>_oracle`; created with its tables, dropped at the end.
- `oracle`: an oracle.Oracle on it, emptied for each test.
- `postgres_template` (session): a migrated cluster's data directory, made once (clusters.py).
- `sut_database`: a ThrowawayPostgres (migrated: a copy of the template) for the system under test;
  skips without root.
- `throwaway_redis`: a ThrowawayRedis, for scenarios where the broker must die.
- `broker_url`: the tests' Redis database (TIMEOUTS_TEST_BROKER_URL), emptied before and after.
- `system`: a System on `sut_database` + `broker_url` + `oracle`, logging to
  var/test-logs/reliability/<test name>/; every process it started is stopped at the end.
- `scheduler`: an oracle.Scheduler on `sut_database`.
"""

import shutil

import psycopg
import pytest
import redis
from django.conf import settings

from tests.support.processes import ROOT

from .clusters import CopiedPostgres, PostgresTemplate, ThrowawayRedis, postgres_available, redis_available
from .oracle import Oracle, Scheduler
from .system import System


def _shared_server_url(database) -> str:
    db = settings.DATABASES["default"]
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    host = f"{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}"
    return f"postgres://{db['USER'] or 'postgres'}{password}@{host}/{database}"


@pytest.fixture(scope="session")
def oracle_dsn():
    name = f"{settings.DATABASES['default']['TEST']['NAME']}_oracle"
    with psycopg.connect(_shared_server_url("postgres"), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    dsn = _shared_server_url(name)
    oracle = Oracle(dsn)
    oracle.create_tables()
    oracle.close()
    yield dsn
    with psycopg.connect(_shared_server_url("postgres"), autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def oracle(oracle_dsn):
    oracle = Oracle(oracle_dsn)
    oracle.reset()
    yield oracle
    oracle.close()


@pytest.fixture(scope="session")
def postgres_template():
    if not postgres_available():
        pytest.skip("needs root (to run PostgreSQL as the postgres user) and PostgreSQL 15's binaries")
    template = PostgresTemplate()
    yield template
    template.destroy()


@pytest.fixture
def sut_database(postgres_template):
    with CopiedPostgres(postgres_template) as cluster:
        yield cluster


@pytest.fixture
def throwaway_redis():
    if not redis_available():
        pytest.skip("needs redis-server")
    with ThrowawayRedis() as server:
        yield server


@pytest.fixture
def broker_url():
    url = settings.CELERY_BROKER_URL
    if not url.startswith("redis://"):
        pytest.skip("the reliability scenarios need a Redis broker")
    client = redis.Redis.from_url(url)
    client.flushdb()
    yield url
    client.flushdb()
    client.close()


@pytest.fixture
def log_dir(request):
    path = ROOT / "var" / "test-logs" / "reliability" / request.node.name.replace("/", "_")
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path


@pytest.fixture
def system(sut_database, broker_url, oracle, log_dir):
    with System(database_url=sut_database.url, broker_url=broker_url, oracle_dsn=oracle.dsn, log_dir=log_dir) as sut:
        yield sut


@pytest.fixture
def scheduler(sut_database, oracle):
    scheduler = Scheduler(sut_database.url, oracle)
    yield scheduler
    scheduler.close()
