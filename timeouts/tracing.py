"""Tracing with OpenTelemetry, when the host uses it: a trace from the code that scheduled a task to
the attempts that ran it, minutes or days later.

- scheduling stores the caller's trace context with the task (`stored_context()`: the W3C
  `traceparent`, and `tracestate` if any, in the row's `trace_context`); nothing without an active span;
- the dispatch of such tasks (`dispatching()`: a span per biz_type of a published batch, with a
  link to each task's context) and every attempt's run (`run_started()` ... `run_ended()`) are
  spans LINKED to that context, not children of it: the scheduling trace has usually ended long
  before, and a trace that lasted days would be one nobody can read.

This is the one module that imports `opentelemetry`, and only if it is installed (the `otel`
extra): without it every function here is a no-op that returns at once. With the API alone and no
tracer provider configured, a stored context still propagates (a host may pass one through
without recording), but no span is made: a no-op span costs more than the cheap check of the
provider that avoids it.
"""

import re
from contextlib import contextmanager, nullcontext

from timeouts import registry

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace import (
        Link,
        NoOpTracerProvider,
        ProxyTracerProvider,
        SpanContext,
        SpanKind,
        Status,
        StatusCode,
        TraceFlags,
        TraceState,
    )
except ImportError:  # the `otel` extra is not installed
    trace = None

# How the attributes are named: timeouts' own namespace, as OpenTelemetry's conventions ask of a library.
BIZ_TYPE, BIZ_ID, JOB_ID, ATTEMPT = "timeouts.biz_type", "timeouts.biz_id", "timeouts.job_id", "timeouts.attempt"
LATENESS, KIND, OUTCOME = "timeouts.lateness_ms", "timeouts.kind", "timeouts.outcome"
TASKS = "timeouts.tasks"  # on a dispatch span: how many tasks it links to
# The kind of a handler's task (the kinds of work extensions add have labels of their own: registry.Kind).
HANDLER_KIND = "handler"

# A W3C traceparent as W3C's propagator reads it: version, trace id, parent id, flags, and what a
# later version may add. Read here rather than through the propagator, which builds a context and a
# span around it only to be unwrapped again, for every task.
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
# The longest traceparent and tracestate it reads (longer: no context, no tracestate).
_TRACEPARENT_LIMIT, _TRACESTATE_LIMIT = 512, 8192
# At most this many links per dispatch span: OpenTelemetry's default limit (OTEL_SPAN_LINK_COUNT_LIMIT),
# beyond which the SDK drops links; a larger batch has a span per this many of its tasks.
LINKS_PER_DISPATCH = 128

if trace is not None:
    # Providers that make no spans: none configured yet (the proxy), or the API's explicit no-op.
    _NO_SPANS = (ProxyTracerProvider, NoOpTracerProvider)
    _tracer_of = (None, None)  # (provider, its tracer, or None if it makes no spans)


def stored_context() -> str | None:
    """The caller's trace context as a task stores it: the W3C `traceparent`, then a space and the
    `tracestate` when there is one (a traceparent has no space: the first one separates them); None
    without an active span, or without OpenTelemetry. Whatever propagators the host configured,
    the stored form is W3C's, which every tracing system reads."""
    if trace is None:
        return None
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    # What W3C's propagator writes (version 00), without the carrier it writes into.
    traceparent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    tracestate = context.trace_state.to_header() if context.trace_state else ""
    return f"{traceparent} {tracestate}" if tracestate else traceparent


def linked_context(stored: str | None):
    """The span context `stored_context()` stored, for a link; None if there is none, or if it does
    not read as a W3C trace context."""
    if trace is None or not stored:
        return None
    traceparent, _, tracestate = stored.partition(" ")
    match = _TRACEPARENT.fullmatch(traceparent) if len(traceparent) <= _TRACEPARENT_LIMIT else None
    if match is None:
        return None
    version, trace_id, span_id, flags, more = match.groups()
    if version == "ff" or (version == "00" and more):  # invalid, as W3C's propagator reads them
        return None
    context = SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=True, trace_flags=TraceFlags(int(flags, 16)),
                          trace_state=TraceState.from_header([tracestate]) if 0 < len(tracestate) <= _TRACESTATE_LIMIT
                          else None)
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


# --- The dispatch ------------------------------------------------------------------------------------

@contextmanager
def dispatching(claims):
    """Around the publishing of `claims` (dispatch/publishing.py): for the claims of each biz_type
    that carry a stored trace context, a span with a link to each one's context, the link carrying
    the task's job_id, biz_id, attempt and lateness (LINKS_PER_DISPATCH at most per span), ended
    once the claims are published. One span per batch rather than per task: a span costs the
    dispatcher far more than a link does. A publish that fails records the error on them: those
    claims were given back, to be claimed again. A task scheduled outside any span has no link (it
    would be a trace of its own, one span long); its run span is made all the same."""
    if trace is None:
        yield
        return
    traced = [claim for claim in claims if claim.trace_context is not None]
    tracer = _tracer() if traced else None
    if tracer is None:
        yield
        return
    spans = [
        tracer.start_span(f"timeouts dispatch {biz_type}", kind=SpanKind.PRODUCER, links=links,
                          attributes={BIZ_TYPE: biz_type, KIND: _kind(biz_type), TASKS: len(links)})
        for biz_type, links in _dispatch_links(traced)
    ]
    try:
        yield
    except BaseException as exc:
        for span in spans:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, "not published: the claims were given back"))
        raise
    finally:
        for span in spans:
            span.end()


def _dispatch_links(claims):
    """(biz_type, links) for each dispatch span of `claims`: by biz_type, in the order claimed,
    LINKS_PER_DISPATCH at most each."""
    by_biz_type = {}
    for claim in claims:
        context = linked_context(claim.trace_context)
        if context is not None:
            by_biz_type.setdefault(claim.biz_type, []).append(Link(context, {
                JOB_ID: claim.job_id, BIZ_ID: claim.biz_id, ATTEMPT: claim.attempt,
                # Negative for a task claimed ahead of its time (the dispatcher's lead).
                LATENESS: _milliseconds(claim.claimed_at, claim.run_at)}))
    for biz_type, links in by_biz_type.items():
        for first in range(0, len(links), LINKS_PER_DISPATCH):
            yield biz_type, links[first:first + LINKS_PER_DISPATCH]


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
    context = linked_context(stored)
    return tracer.start_span(
        f"timeouts run {task.biz_type}", kind=SpanKind.CONSUMER, links=[Link(context)] if context is not None else None,
        attributes={BIZ_TYPE: task.biz_type, BIZ_ID: task.biz_id, JOB_ID: task.job_id, ATTEMPT: fence.attempt,
                    KIND: _kind(task.biz_type), LATENESS: _milliseconds(task.started_at, task.run_at)},
    )


def active(span):
    """The attempt's body runs with its span current, so that the spans it makes are its children.
    The span's errors are recorded by run_failed(), which knows whether the attempt failed."""
    if span is None:
        return nullcontext()
    return _Current(span)


class _Current:
    """`span` current for the block: what trace.use_span() does without recording errors, minus its
    generator's cost on every task."""

    __slots__ = ("span", "token")

    def __init__(self, span):
        self.span = span

    def __enter__(self):
        self.token = otel_context.attach(trace.set_span_in_context(self.span))
        return self.span

    def __exit__(self, *exc_info):
        otel_context.detach(self.token)
        return False


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
