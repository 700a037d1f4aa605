"""A trace across real processes: a task scheduled inside a span of this process is claimed by a real
dispatcher (`manage.py timeouts_dispatcher`) and run by a real Celery worker (prefork), minutes or
here a fraction of a second later. Both processes record their spans with OpenTelemetry's SDK
(tests/tracing/settings.py) into files this test reads: the dispatch and every attempt's run are
linked to the scheduling span, with the task's attributes, and a failing handler's runs are errors
that say retry, then dead."""

import os
import sys
from contextlib import contextmanager

import pytest
from django.db import connection
from opentelemetry import trace

import timeouts
from tests.support import processes
from tests.tracing import exporting
from tests.tracing.exporting import read_spans, recording
from timeouts.dispatch.listener import APPLICATION_NAME

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.one_leg,
              pytest.mark.timeout(120)]


def listening_dispatchers() -> set[int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s AND datname = current_database()",
                       [APPLICATION_NAME])
        return {pid for (pid,) in cursor.fetchall()}


@contextmanager
def dispatcher(env):
    """`manage.py timeouts_dispatcher`, once its LISTEN connection is up; stopped by PID."""
    before = listening_dispatchers()
    process = processes.spawn([sys.executable, "manage.py", "timeouts_dispatcher"], env=env,
                              log_name="traced-dispatcher")
    try:
        processes.wait_for(lambda: listening_dispatchers() - before or process.poll() is not None, 30,
                           message="the dispatcher to connect")
        assert process.poll() is None, f"the dispatcher exited with {process.returncode}: see var/test-logs/"
        yield process
    finally:
        processes.stop(process)


@pytest.fixture
def traced(transactional_db, broker, tmp_path):
    """A worker and a dispatcher that write their spans to a folder; yields the folder."""
    folder = tmp_path / "spans"
    folder.mkdir()
    env = processes.django_env(DJANGO_SETTINGS_MODULE="tests.tracing.settings", **{exporting.SPANS_DIR: folder})
    broker.flushdb()
    with processes.running_worker(env=env, name="traced-worker"), dispatcher(env):
        yield folder


def ids(span) -> list:
    context = span.get_span_context()
    return [[context.trace_id, context.span_id]]


def test_the_dispatch_and_each_run_in_real_processes_link_to_the_scheduling_span(traced):
    with recording(), trace.get_tracer("test").start_as_current_span("checkout") as checkout:
        done = timeouts.schedule("test.record", "order-1", delay=0.3)
        failing = timeouts.schedule("test.fail", "order-2", delay=0.3)  # two attempts, then DEAD

    def all_ended():
        spans = read_spans(traced)
        runs = [span for span in spans if span["name"].startswith("timeouts run ")]
        dispatches = [span for span in spans if span["name"].startswith("timeouts dispatch ")]
        return spans if len(runs) >= 3 and len(dispatches) >= 3 else None

    spans = processes.wait_for(all_ended, 60, interval=0.2, message="three attempts' spans")
    runs = {(s["attributes"]["timeouts.job_id"], s["attributes"]["timeouts.attempt"]): s
            for s in spans if s["name"].startswith("timeouts run ")}
    # A dispatch span links to each task it published; the link says which task and attempt.
    dispatches = {(link["timeouts.job_id"], link["timeouts.attempt"]): s
                  for s in spans if s["name"].startswith("timeouts dispatch ") for link in s["link_attributes"]}
    expected = {(done.job_id, 1), (failing.job_id, 1), (failing.job_id, 2)}
    assert set(runs) == expected and set(dispatches) == expected
    for span in [*runs.values(), *dispatches.values()]:
        assert span["links"] == ids(checkout) * len(span["links"]), span
        assert span["trace_id"] != checkout.get_span_context().trace_id  # linked, not a child
        assert span["pid"] != os.getpid()

    run = runs[done.job_id, 1]
    assert run["name"] == "timeouts run test.record" and run["kind"] == "CONSUMER"
    assert run["attributes"]["timeouts.lateness_ms"] >= 0
    assert {key: value for key, value in run["attributes"].items() if key != "timeouts.lateness_ms"} == {
        "timeouts.biz_type": "test.record", "timeouts.biz_id": "order-1", "timeouts.job_id": done.job_id,
        "timeouts.attempt": 1, "timeouts.kind": "handler", "timeouts.outcome": "done"}
    assert run["status"] == "UNSET" and run["events"] == []
    dispatch = dispatches[done.job_id, 1]
    assert dispatch["name"] == "timeouts dispatch test.record" and dispatch["kind"] == "PRODUCER"
    assert dispatch["attributes"]["timeouts.biz_type"] == "test.record"
    [link] = [link for link in dispatch["link_attributes"] if link["timeouts.job_id"] == done.job_id]
    assert link["timeouts.biz_id"] == "order-1" and "timeouts.lateness_ms" in link

    for attempt, outcome in ((1, "retry"), (2, "dead")):
        run = runs[failing.job_id, attempt]
        assert run["name"] == "timeouts run test.fail"
        assert run["attributes"]["timeouts.outcome"] == outcome
        assert run["status"] == "ERROR" and run["events"] == ["exception"]
