"""The tracing scenario's pieces that need no database: the exporter that drops spans and counts
them, the settings module that configures the worker's pool processes and the dispatcher, and the
scenario's ratios, targets and table."""

import json
import os
import subprocess
import sys

import pytest

from benchmarks import report, span_sink, tracing_cost
from tests.support.processes import ROOT
from tests.unit.bench.sections import sections
from timeouts import tracing

pytestmark = pytest.mark.timeout(60)


def test_spans_are_dropped_and_counted_in_a_file_of_each_process(tmp_path):
    provider = span_sink.tracer_provider("bench", tmp_path)
    tracer = provider.get_tracer("test")
    for _ in range(3):
        with tracer.start_as_current_span("schedule"):
            # What schedule() stores inside such a span: the span's own context.
            assert tracing.stored_context().startswith("00-")
    provider.shutdown()  # exports what the batch holds

    assert span_sink.exported(tmp_path) == 3
    assert [path.name for path in tmp_path.iterdir()] == [f"bench-{os.getpid()}"]


def provider_in(*argv, signal=False) -> str:
    """The class of the global tracer provider in a process that loads the settings with tracing on
    (as `argv` says), after Celery's worker_process_init if `signal`."""
    code = ("import sys, json; sys.argv = json.loads(sys.argv[1]); import benchmarks.settings_tracing\n"
            "from celery.signals import worker_process_init\n"
            + ("worker_process_init.send(sender=None)\n" if signal else "")
            + "from opentelemetry import trace; print(type(trace.get_tracer_provider()).__name__)")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(list(argv))], cwd=ROOT, capture_output=True,
                          text=True, timeout=30, check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return done.stdout.strip()


def test_the_settings_with_tracing_configure_the_dispatcher_and_each_pool_process_and_nothing_else():
    assert provider_in("django", "timeouts_dispatcher") == "TracerProvider"
    assert provider_in("celery", "-A", "project", "worker", signal=True) == "TracerProvider"
    # A worker's main process (it makes no spans; its pool processes each get their own) and others.
    assert provider_in("celery", "-A", "project", "worker") == "ProxyTracerProvider"


def test_a_pool_process_exports_the_spans_it_holds_as_it_ends(tmp_path):
    code = ("import benchmarks.settings_tracing\n"
            "from celery.signals import worker_process_init, worker_process_shutdown\n"
            "from opentelemetry import trace\n"
            "worker_process_init.send(sender=None)\n"
            "for _ in range(5): trace.get_tracer('test').start_span('run').end()\n"
            "worker_process_shutdown.send(sender=None, pid=0, exitcode=0)\n"
            "import os; os._exit(0)  # as a pool process ends: no atexit\n")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=30, check=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT), span_sink.SPANS_DIR: str(tmp_path)})

    assert span_sink.exported(tmp_path) == 5


def runs_of_one_repeat(rep, p99_on, drain_on):
    def one(variant, p99, drain):
        return {"scenario": "tracing", "path": variant, "rep": rep, "p50_ms": 1.0, "p99_ms": p99,
                "drain_per_s": drain, "claim_per_s": 9000, "sched_per_s": 2000, "missing": 0, "duplicates": 0,
                "early": 0, "drain_missing": 0, "drain_duplicates": 0, "drain_early": 0,
                "traced": 0 if variant == "off" else 100}
    return [one("off", 4.0, 1000), one("on", p99_on, drain_on)]


def test_the_scenario_has_its_ratios_targets_and_table():
    runs = runs_of_one_repeat(0, 4.8, 980) + runs_of_one_repeat(1, 4.0, 900)
    summary = report.aggregate(runs)
    ratios = tracing_cost.ratios(runs)
    assert ratios["tracing"]["on/off"]["p99_ms"]["median"] == pytest.approx(1.1)
    checks = {name: (value, check(value)) for _, name, value, check in tracing_cost.targets(summary, ratios)}
    assert checks["tracing: spread lateness p99, on / off <= 1.05"] == (1.1, False)
    assert checks["tracing: drain starts/s, on / off >= 0.95"] == (0.94, False)
    assert checks["tracing: missing + duplicates + early = 0, spread and drain (every run, both variants)"] == (0, True)
    tables = {title.split(":")[0]: rows for title, _, rows in sections(summary, ratios)}
    assert [row[0] for row in tables["tracing"]] == [tracing_cost.LABELS[v] for v in ("off", "on")]
