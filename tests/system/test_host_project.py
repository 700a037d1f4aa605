"""A separate host project, laid out as the tutorial's, uses every call of the public API with the
built wheel installed in a fresh virtualenv: no file of this repository on its path, and only the
dependencies the wheel declares (with the extras the tutorial names, and [tasks] for Django's tasks
framework on 5.2). Runs in both legs: the tasks framework is the backport on Django 5.2 and built
in on 6.0."""

import os
import subprocess
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from tests.support import distributions

HOST = Path(__file__).resolve().parent / "host_project"
EXTRAS = ("binary", "redis", "tasks")  # not [prometheus]: the host checks what its absence says


@pytest.fixture
def host_database():
    params = {k: v for k, v in connection.get_connection_params().items() if k not in ("cursor_factory", "context")}
    name = f"timeouts_host_{os.getpid()}"
    admin = psycopg.connect(**{**params, "dbname": "postgres"}, autocommit=True)
    admin.execute(f'DROP DATABASE IF EXISTS "{name}"')
    admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name, params
    finally:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_host_project_uses_the_whole_public_api_from_the_installed_wheel(tmp_path_factory, tmp_path,
                                                                           host_database):
    name, params = host_database
    built = distributions.built(tmp_path_factory)
    python = distributions.fresh_venv(tmp_path / "venv", built.wheel, EXTRAS)
    # Nothing of this environment: no PYTHONPATH to the repository, no settings or broker of the tests.
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "LANG": "C.UTF-8",
           "PYTHONPATH": str(HOST), "DJANGO_SETTINGS_MODULE": "hostsite.settings", "HOST_DB_NAME": name,
           "HOST_DB_HOST": str(params.get("host") or "127.0.0.1"), "HOST_DB_PORT": str(params.get("port") or 5432)}
    result = subprocess.run([str(python), "use_public_api.py"], cwd=HOST, env=env, capture_output=True, text=True,
                            timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PUBLIC API OK" in result.stdout
