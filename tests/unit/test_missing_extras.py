"""Without an optional dependency, timeouts still loads, and the feature that needs it says which
extra to install. Each case runs in a child interpreter in which the dependency cannot be imported
(None in sys.modules), so the test holds whatever this environment has installed."""

import subprocess
import sys
import textwrap

import pytest

from tests.support.processes import ROOT

pytestmark = pytest.mark.timeout(60)

SETUP = """
import sys
for blocked in {blocked!r}:
    sys.modules[blocked] = None
import django
from django.conf import settings
settings.configure(
    SECRET_KEY="x", USE_TZ=True,
    INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "timeouts"],
    DATABASES={{"default": {{"ENGINE": "django.db.backends.postgresql", "NAME": "unused"}}}},
)
django.setup()  # every project loads timeouts.backends.queues: it must not need the framework
"""


def run(blocked, body) -> str:
    code = SETUP.format(blocked=blocked) + textwrap.dedent(body)
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=50,
                            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_without_django_tasks_the_backend_says_which_extra_to_install():
    out = run(("django.tasks", "django_tasks"), """
        import timeouts.backends
        from django.utils.module_loading import import_string
        for ask in (lambda: import_string("timeouts.backends.TimeoutsBackend"),
                    lambda: timeouts.backends.cancel,
                    lambda: __import__("timeouts.backends.backend")):
            try:
                ask()
            except ImportError as exc:
                print(exc)
            else:
                raise AssertionError("an ImportError was expected")
    """)
    lines = out.splitlines()
    assert len(lines) == 3 and all('pip install "django-timeouts[tasks]"' in line for line in lines), out
    assert "django-tasks" in lines[0] and "Django 6.0 has it built in" in lines[0]


def test_without_prometheus_client_the_metrics_view_says_which_extra_to_install():
    out = run(("prometheus_client",), """
        from timeouts import metrics
        response = metrics.metrics_view(None)
        print(response.status_code, response.content.decode())
    """)
    assert out.startswith("501 ") and 'pip install "django-timeouts[prometheus]"' in out, out


def test_without_prometheus_client_what_needs_it_raises_improperly_configured_naming_the_extra():
    out = run(("prometheus_client",), """
        from django.core.exceptions import ImproperlyConfigured
        from timeouts import metrics
        metrics.connect()  # counts nothing, raises nothing: every process calls it at start-up
        for ask in (metrics.exposition, lambda: metrics.exposition(using="default"), metrics.DatabaseCollector,
                    lambda: metrics.record("started", "order.close", lateness=0.1),
                    lambda: metrics.record("done", "order.close")):
            try:
                ask()
            except ImproperlyConfigured as exc:
                print(exc)
            else:
                raise AssertionError("ImproperlyConfigured was expected")
    """)
    lines = out.splitlines()
    assert len(lines) == 5 and all('pip install "django-timeouts[prometheus]"' in line for line in lines), out
    assert "prometheus_client" in lines[0]


def test_without_opentelemetry_tracing_is_a_no_op_and_imports_nothing():
    out = run(("opentelemetry",), """
        import sys
        from types import SimpleNamespace
        from timeouts import tracing
        from timeouts.dispatch import publishing  # noqa: F401 (every module that traces loads)
        from timeouts.store import scheduling  # noqa: F401
        from timeouts.worker import attempt  # noqa: F401
        assert tracing.trace is None
        assert tracing.stored_context() is None
        assert tracing.linked_context("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01") is None
        assert tracing.run_started(None, None, "anything") is None
        with tracing.active(None), tracing.dispatching([SimpleNamespace(trace_context="x")]):
            tracing.run_failed(None, ValueError())
            tracing.run_ended(None, "done")
        print(sorted(name for name, module in sys.modules.items()
                     if name.startswith("opentelemetry") and module is not None))
    """)
    assert out.strip() == "[]", out
