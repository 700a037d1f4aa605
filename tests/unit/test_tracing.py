"""The trace context a task stores (timeouts.tracing): what is captured from the caller, and the link
read back from it. No database: the spans are OpenTelemetry's SDK's, recorded in memory."""

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from opentelemetry import context, trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

from tests.tracing.exporting import recording
from timeouts import tracing

pytestmark = pytest.mark.timeout(30)


def traceparent(span_context) -> str:
    return f"00-{span_context.trace_id:032x}-{span_context.span_id:016x}-{span_context.trace_flags:02x}"


def test_without_an_active_span_nothing_is_stored():
    assert tracing.stored_context() is None
    with recording():
        assert tracing.stored_context() is None


def test_inside_a_span_its_w3c_traceparent_is_stored():
    with recording(), trace.get_tracer("test").start_as_current_span("checkout") as span:
        stored = tracing.stored_context()
    assert stored == traceparent(span.get_span_context())
    assert span.get_span_context().trace_flags.sampled


def test_a_tracestate_is_stored_after_a_space_and_read_back():
    remote = SpanContext(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, is_remote=True,
                         trace_flags=TraceFlags(TraceFlags.SAMPLED),
                         trace_state=TraceState([("congo", "t61rcWkgMzE"), ("rojo", "00f067aa0ba902b7")]))
    token = context.attach(trace.set_span_in_context(NonRecordingSpan(remote)))
    try:
        stored = tracing.stored_context()
    finally:
        context.detach(token)
    assert stored == "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
    linked = tracing.linked_context(stored)
    assert (linked.trace_id, linked.span_id, linked.is_remote) == (remote.trace_id, remote.span_id, True)
    assert linked.trace_flags.sampled
    assert dict(linked.trace_state) == {"congo": "t61rcWkgMzE", "rojo": "00f067aa0ba902b7"}


def test_without_a_tracer_provider_a_propagated_context_is_still_stored():
    """The API alone, a context taken from an incoming request: passing it on costs nothing more."""
    remote = SpanContext(0x1, 0x2, is_remote=True, trace_flags=TraceFlags(TraceFlags.DEFAULT))
    token = context.attach(trace.set_span_in_context(NonRecordingSpan(remote)))
    try:
        stored = tracing.stored_context()
    finally:
        context.detach(token)
    assert stored == f"00-{1:032x}-{2:016x}-00"


@pytest.mark.parametrize("stored", [None, "", "garbage", "00-" + "0" * 32 + "-" + "1" * 16 + "-01",
                                    "zz-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"])
def test_nothing_or_no_valid_context_links_nothing(stored):
    assert tracing.linked_context(stored) is None


def test_without_a_tracer_provider_no_span_is_made():
    task = SimpleNamespace(biz_type="test.record", biz_id="1", job_id=1, started_at=datetime.now(UTC),
                           run_at=datetime.now(UTC))
    assert tracing.run_started(task, SimpleNamespace(attempt=1), None) is None
    with tracing.active(None):
        tracing.run_ended(None, "done")
    with tracing.dispatching([SimpleNamespace(trace_context="00-" + "1" * 32 + "-" + "2" * 16 + "-01")]):
        pass


def test_the_run_span_links_to_the_stored_context_and_says_how_the_attempt_went():
    now = datetime.now(UTC)
    task = SimpleNamespace(biz_type="order.close", biz_id="o-1", job_id=42, started_at=now + timedelta(milliseconds=7),
                           run_at=now)
    with recording() as exporter:
        with trace.get_tracer("test").start_as_current_span("checkout") as scheduling:
            stored = tracing.stored_context()
        span = tracing.run_started(task, SimpleNamespace(attempt=2), stored)
        with tracing.active(span):
            inner = trace.get_tracer("test").start_span("handler's own")
            inner.end()
        tracing.run_failed(span, ValueError("no such order"))
        tracing.run_ended(span, "retry")
    by_name = {s.name: s for s in exporter.get_finished_spans()}
    run = by_name["timeouts run order.close"]
    assert run.kind == trace.SpanKind.CONSUMER and run.parent is None
    [link] = run.links
    assert (link.context.trace_id, link.context.span_id) == (scheduling.get_span_context().trace_id,
                                                             scheduling.get_span_context().span_id)
    assert run.context.trace_id != scheduling.get_span_context().trace_id  # a trace of its own
    assert dict(run.attributes) == {"timeouts.biz_type": "order.close", "timeouts.biz_id": "o-1",
                                    "timeouts.job_id": 42, "timeouts.attempt": 2, "timeouts.kind": "handler",
                                    "timeouts.lateness_ms": pytest.approx(7.0), "timeouts.outcome": "retry"}
    assert run.status.status_code == trace.StatusCode.ERROR and "no such order" in run.status.description
    assert [event.name for event in run.events] == ["exception"]
    assert by_name["handler's own"].parent.span_id == run.context.span_id
