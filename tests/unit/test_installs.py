"""timeouts connects its Celery signal receivers from TimeoutsConfig.ready(), each piece by name and
once, never as a side effect of importing a module: which modules other imports happened to load
must not decide what a worker does. Checked in a child interpreter, where nothing is loaded yet."""

import json
import subprocess
import sys
import textwrap

import pytest

from tests.support.processes import ROOT

pytestmark = pytest.mark.timeout(60)

CHILD = """
import importlib
import json
import pkgutil
import weakref
from collections import Counter

import django
from celery import signals
from celery.utils.dispatch.signal import Signal
from django.conf import settings

settings.configure(
    SECRET_KEY="x", USE_TZ=True,
    INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "timeouts"],
    DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "unused"}},
)
SIGNALS = {name: value for name, value in vars(signals).items() if isinstance(value, Signal)}


def connected():
    found = Counter()
    for name, signal in SIGNALS.items():
        for _, receiver in signal.receivers:
            if isinstance(receiver, weakref.ReferenceType):
                receiver = receiver()
            module = getattr(receiver, "__module__", None) or ""
            if module.split(".")[0] == "timeouts":
                found[f"{name}: {module}.{receiver.__qualname__}"] += 1
    return found


def import_everything():
    imported = []
    import timeouts
    # A package that cannot be imported yet is skipped, with what it holds.
    for module in pkgutil.walk_packages(timeouts.__path__, "timeouts.", onerror=lambda name: None):
        try:
            importlib.import_module(module.name)
        except Exception:  # needs the app registry (the models): imported again once Django is set up
            continue
        imported.append(module.name)
    return imported


before_setup = import_everything()
on_import = connected()
django.setup()
installed = connected()
after_setup = import_everything()
on_later_imports = connected()

from timeouts.dispatch import in_worker
from timeouts.durable import starts
from timeouts.worker import leases, pool_process_exit, priority

for install in (in_worker.connect, leases.install, priority.install, pool_process_exit.install, starts.install):
    install()
print(json.dumps({"before_setup": before_setup, "on_import": on_import, "installed": installed,
                  "after_setup": after_setup, "on_later_imports": on_later_imports,
                  "installed_again": connected()}))
"""


@pytest.fixture(scope="module")
def child() -> dict:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(CHILD)], cwd=ROOT, capture_output=True, text=True,
                            timeout=50, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stdout + result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def test_importing_a_module_connects_nothing(child):
    assert {"timeouts.durable.starts", "timeouts.worker.leases", "timeouts.worker.priority"} <= set(
        child["before_setup"])
    assert child["on_import"] == {}


def test_ready_installs_each_piece_once(child):
    installed = child["installed"]
    assert {
        "worker_init: timeouts.durable.starts._add_consumer_step",
        "worker_init: timeouts.worker.leases._in_a_worker",
        "worker_process_init: timeouts.worker.leases._in_a_pool_process",
        "worker_init: timeouts.worker.priority.add_steps",
        "task_received: timeouts.worker.priority.received",
    } <= set(installed)
    assert set(installed.values()) == {1}


def test_an_install_made_again_connects_nothing_more(child):
    assert child["on_later_imports"] == child["installed"]  # every module loaded now, the admin's too
    assert len(child["after_setup"]) > len(child["before_setup"])
    assert child["installed_again"] == child["installed"]
