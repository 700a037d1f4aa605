"""Where the tests' spans go: OpenTelemetry's SDK with its in-memory exporter in the test process,
and, in the processes a test starts (a worker, a dispatcher), an exporter that writes each finished
span to a file the test reads. Test-only: the package configures no tracing of its own, the host
does."""

import json
import os
from contextlib import contextmanager
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once

# The folder a process started by a test writes its spans to (tests/tracing/settings.py).
SPANS_DIR = "TIMEOUTS_TEST_SPANS_DIR"


def _install(provider):
    """Make `provider` the process's global one. OpenTelemetry sets it once per process; a test
    replaces it as OpenTelemetry's own test utilities do (opentelemetry.test.globals_test)."""
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None
    if provider is not None:
        trace.set_tracer_provider(provider)


@contextmanager
def recording():
    """A tracer provider that records into memory, for the block; yields its exporter. Afterwards no
    provider is configured, as before."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _install(provider)
    try:
        yield exporter
    finally:
        _install(None)
        provider.shutdown()


def as_dict(span) -> dict:
    """What the tests read of a finished span, in the same form in this process and in a file."""
    return {
        "name": span.name,
        "trace_id": span.context.trace_id,
        "span_id": span.context.span_id,
        "parent_span_id": span.parent.span_id if span.parent is not None else None,
        "kind": span.kind.name,
        "attributes": dict(span.attributes),
        "links": [[link.context.trace_id, link.context.span_id] for link in span.links],
        "link_attributes": [dict(link.attributes) for link in span.links],
        "status": span.status.status_code.name,
        "events": [event.name for event in span.events],
        "pid": os.getpid(),
    }


class FileSpanExporter(SpanExporter):
    """Each finished span as one JSON line of `folder`/<pid>.jsonl: a prefork worker's pool
    processes inherit the provider and write files of their own."""

    def __init__(self, folder):
        self.folder = Path(folder)

    def export(self, spans):
        with open(self.folder / f"{os.getpid()}.jsonl", "a") as out:
            for span in spans:
                out.write(json.dumps(as_dict(span)) + "\n")
        return SpanExportResult.SUCCESS

    def shutdown(self):
        pass


def export_to_files(folder):
    """This process's spans go to `folder`, each as it ends (no batching: nothing waits for an exit)."""
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(FileSpanExporter(folder)))
    trace.set_tracer_provider(provider)


def read_spans(folder) -> list[dict]:
    """Every span the processes wrote to `folder` so far (a line being written is left for later)."""
    spans = []
    for path in sorted(Path(folder).glob("*.jsonl")):
        for line in path.read_text().splitlines(keepends=True):
            if line.endswith("\n"):
                spans.append(json.loads(line))
    return spans
