"""The sdist and the wheel that `python -m build` makes: the package whole (its SQL files,
templates and py.typed with its code), nothing of the repository around it, and metadata that
`twine check` accepts."""

import email.parser
import subprocess
import sys
import zipfile

import pytest

from tests.support import distributions

pytestmark = pytest.mark.timeout(300)

REPOSITORY_ONLY = ("tests/", "benchmarks/", "project/", "bin/", "docs/", "requirements/", "manage.py")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return distributions.built(tmp_path_factory)


def test_the_sources_hold_the_files_the_package_needs_beside_its_code():
    files = distributions.package_files()
    # What the checks below are about: a loss here would make them vacuous, not pass.
    assert {"timeouts/py.typed", "timeouts/sql/queries/claims.sql"} <= files
    assert [f for f in files if f.startswith("timeouts/sql/migrations/") and f.endswith(".sql")]
    assert [f for f in files if f.startswith("timeouts/templates/") and f.endswith(".html")]


def test_the_wheel_holds_every_file_of_the_package_and_nothing_else(built):
    names = built.wheel_names()
    missing = distributions.package_files() - names
    assert not missing, f"the wheel lacks {sorted(missing)}: see [tool.setuptools.package-data] in pyproject.toml"
    dist_info = f"django_timeouts-{built.wheel.name.split('-')[1]}.dist-info/"
    assert not {name for name in names if not name.startswith(("timeouts/", dist_info))}
    assert f"{dist_info}licenses/LICENSE" in names


def test_the_sdist_holds_what_builds_the_wheel_and_nothing_of_the_repository(built):
    names = built.sdist_names()
    missing = distributions.package_files() - names
    assert not missing, f"the sdist lacks {sorted(missing)}"
    assert {"pyproject.toml", "README.md", "LICENSE", "PKG-INFO"} <= names
    assert not [name for name in names if name.startswith(REPOSITORY_ONLY)]


def test_the_wheel_metadata_names_the_dependencies_and_extras(built):
    with zipfile.ZipFile(built.wheel) as archive:
        [metadata] = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        meta = email.parser.Parser().parsestr(archive.read(metadata).decode())
    assert meta["Name"] == distributions.DISTRIBUTION and meta["License-Expression"] == "MIT"
    assert {"tasks", "redis", "prometheus", "binary"} <= set(meta.get_all("Provides-Extra"))
    requires = meta.get_all("Requires-Dist")
    assert 'django-tasks>=0.12; extra == "tasks"' in requires and "Django<6.1,>=5.2" in requires
    assert meta["Description-Content-Type"] == "text/markdown"


def test_twine_check_accepts_both(built):
    result = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", str(built.sdist), str(built.wheel)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("PASSED") == 2, result.stdout
