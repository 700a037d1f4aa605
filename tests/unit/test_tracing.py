"""The trace context a task stores (timeouts.tracing): what is captured from the caller, and the link
read back from it. No database: the spans are OpenTelemetry's SDK's, recorded in memory."""

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest
from opentelemetry import context, trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

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
                                    "zz-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                                    "00-4bf92f3577b34da6a3ce929d0e0e4736-" + "0" * 16 + "-01",  # no parent id
                                    "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # an invalid version
                                    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-more",  # 00 has 4 parts
                                    "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  # upper case
                                    "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",  # lengths
                                    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
                                    "00-+bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  # int() would take it
                                    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902_7-01",
                                    "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-" + "x" * 500])
def test_nothing_or_no_valid_context_links_nothing(stored):
    assert tracing.linked_context(stored) is None


@pytest.mark.parametrize("stored", [
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
    "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-a-later-version-adds",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 congo=t61rcWkgMzE",
    "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 " + "a=" + "b" * 8200,  # too long: not read
    "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-" + "x" * 450,  # as long as it reads
])
def test_a_stored_context_is_read_as_w3c_s_propagator_reads_it(stored):
    traceparent, _, tracestate = stored.partition(" ")
    carrier = {"traceparent": traceparent, **({"tracestate": tracestate} if tracestate else {})}
    expected = trace.get_current_span(TraceContextTextMapPropagator().extract(carrier)).get_span_context()
    assert expected.is_valid
    assert tracing.linked_context(stored) == expected


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


def claim(biz_type, job_id, stored, lateness_ms=5):
    now = datetime.now(UTC)
    return SimpleNamespace(biz_type=biz_type, biz_id=f"b-{job_id}", job_id=job_id, attempt=1, trace_context=stored,
                           run_at=now, claimed_at=now + timedelta(milliseconds=lateness_ms))


def scheduled_in_a_span(tracer, name):
    with tracer.start_as_current_span(name) as span:
        return span, tracing.stored_context()


def test_a_batch_s_dispatch_is_a_span_per_biz_type_linking_each_task_it_published():
    with recording() as exporter:
        tracer = trace.get_tracer("test")
        first, first_stored = scheduled_in_a_span(tracer, "checkout")
        second, second_stored = scheduled_in_a_span(tracer, "refund")
        many = tracing.LINKS_PER_DISPATCH + 2
        claims = [claim("order.close", job_id, first_stored) for job_id in range(1, many + 1)]
        claims[1:1] = [claim("order.remind", 1000, second_stored, lateness_ms=-3), claim("order.remind", 1001, None),
                       claim("order.remind", 1002, "garbage")]
        with tracing.dispatching(claims):
            pass
    dispatches = [span for span in exporter.get_finished_spans() if span.name.startswith("timeouts dispatch ")]
    # OpenTelemetry drops links beyond its limit: a span per LINKS_PER_DISPATCH tasks keeps each one's.
    assert [(span.name, span.attributes["timeouts.tasks"], len(span.links)) for span in dispatches] == [
        ("timeouts dispatch order.close", tracing.LINKS_PER_DISPATCH, tracing.LINKS_PER_DISPATCH),
        ("timeouts dispatch order.close", 2, 2), ("timeouts dispatch order.remind", 1, 1)]
    for span in dispatches:
        assert span.kind == trace.SpanKind.PRODUCER and span.parent is None
        assert span.status.status_code == trace.StatusCode.UNSET
        assert {k: v for k, v in span.attributes.items() if k != "timeouts.tasks"} == {
            "timeouts.biz_type": span.name.removeprefix("timeouts dispatch "), "timeouts.kind": "handler"}
    closing = [link for span in dispatches[:2] for link in span.links]
    assert [link.attributes["timeouts.job_id"] for link in closing] == list(range(1, many + 1))
    assert {(link.context.trace_id, link.context.span_id) for link in closing} == {
        (first.get_span_context().trace_id, first.get_span_context().span_id)}
    assert dict(closing[0].attributes) == {"timeouts.job_id": 1, "timeouts.biz_id": "b-1", "timeouts.attempt": 1,
                                           "timeouts.lateness_ms": pytest.approx(5.0)}
    # Only the task scheduled in a span is linked: claimed ahead of its time, its lateness is negative.
    [reminding] = dispatches[2].links
    assert (reminding.context.trace_id, reminding.context.span_id) == (second.get_span_context().trace_id,
                                                                       second.get_span_context().span_id)
    assert dict(reminding.attributes) == {"timeouts.job_id": 1000, "timeouts.biz_id": "b-1000",
                                          "timeouts.attempt": 1, "timeouts.lateness_ms": pytest.approx(-3.0)}


def test_a_publish_that_fails_is_an_error_on_each_of_its_dispatch_spans():
    with recording() as exporter:
        _, stored = scheduled_in_a_span(trace.get_tracer("test"), "checkout")
        with pytest.raises(ConnectionError), tracing.dispatching([claim("a.b", 1, stored), claim("c.d", 2, stored)]):
            raise ConnectionError("the broker is gone")
    dispatches = [span for span in exporter.get_finished_spans() if span.name.startswith("timeouts dispatch ")]
    assert len(dispatches) == 2
    for span in dispatches:
        assert span.status.status_code == trace.StatusCode.ERROR
        assert [event.name for event in span.events] == ["exception"]


def test_no_task_scheduled_in_a_span_no_dispatch_span():
    with recording() as exporter:
        with tracing.dispatching([claim("a.b", 1, None), claim("a.b", 2, "garbage")]):
            pass
    assert exporter.get_finished_spans() == ()

