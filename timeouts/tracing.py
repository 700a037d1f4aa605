"""Tracing with OpenTelemetry, when the host uses it: a trace from the code that scheduled a task to
the attempts that ran it, minutes or days later.

- scheduling stores the caller's trace context with the task (`stored_context()`: the W3C
  `traceparent`, and `tracestate` if any, in the row's `trace_context`); nothing without an active span;
- the dispatch of each such task (`dispatching()`) and every attempt's run (`run_started()` ...
  `run_ended()`) are spans LINKED to that context, not children of it: the scheduling trace has
  usually ended long before, and a trace that lasted days would be one nobody can read.

This is the one module that imports `opentelemetry`, and only if it is installed (the `otel`
extra): without it every function here is a no-op that returns at once. With the API alone and no
tracer provider configured, a stored context still propagates (a host may pass one through
without recording), but no span is made: a no-op span costs more than the cheap check of the
provider that avoids it.
"""

from contextlib import contextmanager, nullcontext

from timeouts import registry

try:
    from opentelemetry import trace
    from opentelemetry.trace import Link, NoOpTracerProvider, ProxyTracerProvider, SpanKind, Status, StatusCode
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # the `otel` extra is not installed
    trace = None

# How the attributes are named: timeouts' own namespace, as OpenTelemetry's conventions ask of a library.
BIZ_TYPE, BIZ_ID, JOB_ID, ATTEMPT = "timeouts.biz_type", "timeouts.biz_id", "timeouts.job_id", "timeouts.attempt"
LATENESS, KIND, OUTCOME = "timeouts.lateness_ms", "timeouts.kind", "timeouts.outcome"
# The kind of a handler's task (the kinds of work extensions add have labels of their own: registry.Kind).
HANDLER_KIND = "handler"

if trace is not None:
    _PROPAGATOR = TraceContextTextMapPropagator()
    # Providers that make no spans: none configured yet (the proxy), or the API's explicit no-op.
    _NO_SPANS = (ProxyTracerProvider, NoOpTracerProvider)
    _tracer_of = (None, None)  # (provider, its tracer, or None if it makes no spans)


def stored_context() -> str | None:
    """The caller's trace context as a task stores it: the W3C `traceparent`, then a space and the
    `tracestate` when there is one (a traceparent has no space: the first one separates them); None
    without an active span, or without OpenTelemetry. Whatever propagators the host configured,
    the stored form is W3C's, which every tracing system reads."""
    if trace is None or not trace.get_current_span().get_span_context().is_valid:
        return None
    carrier = {}
    _PROPAGATOR.inject(carrier)
    traceparent = carrier.get("traceparent")
    if traceparent is None:
        return None
    tracestate = carrier.get("tracestate")
    return f"{traceparent} {tracestate}" if tracestate else traceparent


def linked_context(stored: str | None):
    """The span context `stored_context()` stored, for a link; None if there is none, or if it does
    not read as a W3C trace context."""
    if trace is None or not stored:
        return None
    traceparent, _, tracestate = stored.partition(" ")
    carrier = {"traceparent": traceparent}
    if tracestate:
        carrier["tracestate"] = tracestate
    context = trace.get_current_span(_PROPAGATOR.extract(carrier)).get_span_context()
    return context if context.is_valid else None


def _tracer():
    """The configured provider's tracer, or None when no provider that records is configured. A
    process sets its provider once; a test may set another, hence the check of which one it is."""
    global _tracer_of
    provider = trace.get_tracer_provider()
    if provider is not _tracer_of[0]:
        import timeouts

        tracer = None if isinstance(provider, _NO_SPANS) else provider.get_tracer("timeouts", timeouts.__version__)
        _tracer_of = (provider, tracer)
    return _tracer_of[1]


def _kind(biz_type: str) -> str:
    kind = registry.kind_of(biz_type)
    return HANDLER_KIND if kind is None else kind.label


def _milliseconds(later, earlier) -> float:
    return (later - earlier).total_seconds() * 1000.0


def _links(stored):
    context = linked_context(stored)
    return [Link(context)] if context is not None else None


# --- The dispatch ------------------------------------------------------------------------------------

@contextmanager
def dispatching(claims):
    """Around the publishing of `claims` (dispatch/publishing.py): a span for each claim that
    carries a stored trace context, linked to it, ended once the claims are published. A publish
    that fails records the error on them: those claims were given back, to be claimed again. A
    task scheduled outside any span gets no dispatch span (it would be a trace of its own, one span
    long); its run span is made all the same."""
    if trace is None:
        yield
        return
    traced = [claim for claim in claims if claim.trace_context is not None]
    tracer = _tracer() if traced else None
    if tracer is None:
        yield
        return
    spans = [
        tracer.start_span(
            f"timeouts dispatch {claim.biz_type}", kind=SpanKind.PRODUCER, links=_links(claim.trace_context),
            attributes={BIZ_TYPE: claim.biz_type, BIZ_ID: claim.biz_id, JOB_ID: claim.job_id,
                        ATTEMPT: claim.attempt, KIND: _kind(claim.biz_type),
                        # Negative for a task claimed ahead of its time (the dispatcher's lead).
                        LATENESS: _milliseconds(claim.claimed_at, claim.run_at)},
        )
        for claim in traced
    ]
    try:
        yield
    except BaseException as exc:
        for span in spans:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, "not published: the claim was given back"))
        raise
    finally:
        for span in spans:
            span.end()


# --- The run of an attempt ---------------------------------------------------------------------------

def run_started(task, fence, stored: str | None):
    """The span of an attempt that has just started (worker/attempt.py), linked to the trace
    context `stored` with the task, child of whatever span is current (a Celery instrumentation's);
    None when tracing is off. Its lateness is the attempt's, by the database clock: how long after
    the task's run_at it started."""
    if trace is None:
        return None
    tracer = _tracer()
    if tracer is None:
        return None
    return tracer.start_span(
        f"timeouts run {task.biz_type}", kind=SpanKind.CONSUMER, links=_links(stored),
        attributes={BIZ_TYPE: task.biz_type, BIZ_ID: task.biz_id, JOB_ID: task.job_id, ATTEMPT: fence.attempt,
                    KIND: _kind(task.biz_type), LATENESS: _milliseconds(task.started_at, task.run_at)},
    )


def active(span):
    """The attempt's body runs with its span current, so that the spans it makes are its children."""
    if span is None:
        return nullcontext()
    return trace.use_span(span, record_exception=False, set_status_on_exception=False)


def run_failed(span, exc: BaseException):
    """The body raised, and the attempt failed (not a Celery retry or Ignore of a stored call)."""
    if span is not None:
        span.record_exception(exc)
        span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))


def run_ended(span, outcome: str | None):
    """End the attempt's span, saying how it ended: done (the body returned; its DONE is written
    next), retry, dead, lost (its lease had run out), unrecorded (a stored call's ending could not
    be written), or stopped (the worker stopped during it: it runs again once its lease runs out).
    None: writing the ending failed, and its error goes on."""
    if span is not None:
        if outcome is not None:
            span.set_attribute(OUTCOME, outcome)
        span.end()
