"""A separate host project uses every call of the public API with only the built wheel installed."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from tests.processes import ROOT

HOST = Path(__file__).resolve().parent / "host_project"


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
@pytest.mark.timeout(180)
def test_a_host_project_uses_the_whole_public_api_from_the_wheel(tmp_path, host_database):
    name, params = host_database
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "dist"), str(ROOT)],
                   check=True, capture_output=True, timeout=120)
    [wheel] = (tmp_path / "dist").glob("*.whl")
    installed = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(installed)
    assert sorted(p.name for p in installed.iterdir() if not p.name.endswith(".dist-info")) == ["timeouts"]
    env = {**os.environ, "PYTHONPATH": f"{installed}{os.pathsep}{HOST}", "DJANGO_SETTINGS_MODULE": "hostsite.settings",
           "HOST_DB_NAME": name, "HOST_DB_HOST": str(params.get("host") or "127.0.0.1"),
           "HOST_DB_PORT": str(params.get("port") or 5432)}
    result = subprocess.run([sys.executable, "use_public_api.py"], cwd=HOST, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PUBLIC API OK" in result.stdout
