"""pyproject.toml says what CI tests: its Python and Django classifiers are the versions bin/test's
legs run, its dependency ranges and extras hold the versions requirements/ pins, and the messages
that name an extra name one that exists, under the distribution's name."""

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from timeouts.backends.compat import INSTALL_TASKS
from timeouts.metrics import INSTALL_PROMETHEUS

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# The pinned sets of bin/test's two legs.
LEG_REQUIREMENTS = ("requirements/test.txt", "requirements/test-django60.txt")


def pins(path) -> dict:
    """{canonical name: Requirement} of a requirements file's `name==version` lines."""
    found = {}
    for line in (ROOT / path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            requirement = Requirement(line)
            found[canonicalize_name(requirement.name)] = requirement
    return found


def pinned_version(requirement: Requirement) -> str:
    [spec] = requirement.specifier
    assert spec.operator == "==", requirement
    return spec.version


def classified(prefix) -> set:
    return {c.removeprefix(prefix) for c in PROJECT["classifiers"] if re.fullmatch(re.escape(prefix) + r"\d+\.\d+", c)}


def test_the_python_classifiers_are_the_versions_bin_test_runs():
    legs = set(re.findall(r"find_python (3\.\d+)", (ROOT / "bin/test").read_text()))
    assert classified("Programming Language :: Python :: ") == legs == {"3.11", "3.12"}
    assert PROJECT["requires-python"] == f">={min(legs, key=lambda v: tuple(map(int, v.split('.'))))}"


def test_the_django_classifiers_are_the_versions_the_legs_pin():
    tested = {".".join(pinned_version(pins(path)["django"]).split(".")[:2]) for path in LEG_REQUIREMENTS}
    assert classified("Framework :: Django :: ") == tested == {"5.2", "6.0"}
    assert {"Framework :: Django", "Framework :: Celery", "Typing :: Typed"} <= set(PROJECT["classifiers"])


def test_the_license_is_an_spdx_expression_with_its_file():
    # PEP 639: the expression replaces the License :: classifiers (setuptools refuses both at once).
    assert PROJECT["license"] == "MIT" and (ROOT / "LICENSE").exists()
    assert not [c for c in PROJECT["classifiers"] if c.startswith("License ::")]


@pytest.mark.parametrize("path", LEG_REQUIREMENTS)
def test_every_pinned_dependency_and_extra_is_in_the_declared_ranges(path):
    pinned = pins(path)
    declared = [Requirement(r) for r in PROJECT["dependencies"]]
    declared += [Requirement(r) for extra in PROJECT["optional-dependencies"].values() for r in extra]
    for requirement in declared:
        version = pinned_version(pinned[canonicalize_name(requirement.name)])
        assert requirement.specifier.contains(version), f"{path} pins {requirement.name}=={version}: not {requirement}"


def test_the_extras_that_messages_name_exist_under_the_distribution_name():
    assert PROJECT["name"] == "django-timeouts"
    assert {"tasks", "redis", "prometheus", "binary"} <= set(PROJECT["optional-dependencies"])
    assert INSTALL_TASKS == f'pip install "{PROJECT["name"]}[tasks]"'
    assert [Requirement(r).name for r in PROJECT["optional-dependencies"]["tasks"]] == ["django-tasks"]
    assert INSTALL_PROMETHEUS == f'pip install "{PROJECT["name"]}[prometheus]"'
    assert [Requirement(r).name for r in PROJECT["optional-dependencies"]["prometheus"]] == ["prometheus-client"]
