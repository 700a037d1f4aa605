"""OpenTelemetry's SDK as a host configures it, with an exporter that drops every span: what tracing
costs the processes that make the spans, without the cost of sending them anywhere.

Each process configures its own provider, as docs/howto/tracing.md says: the dispatcher when it
starts, each pool process of a prefork worker from Celery's `worker_process_init` (the
BatchSpanProcessor's thread is not inherited across the fork), and the bench process a provider of
its own for the spans its schedule() calls run in. Each exporter writes how many spans it dropped
to a file of its own in the folder SPANS_DIR names, if set: the proof that spans were made.

Imports opentelemetry-sdk: only the tracing scenario and its settings module import this.
"""

import os
import sys
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

SPANS_DIR = "TIMEOUTS_BENCH_SPANS_DIR"  # environment: where each exporter writes its count


class DroppingExporter(SpanExporter):
    """Takes each batch and drops it, counting its spans."""

    def __init__(self, service, folder=None):
        self.path = Path(folder) / f"{service}-{os.getpid()}" if folder else None
        self.count = 0

    def export(self, spans):
        self.count += len(spans)
        if self.path is not None:
            self.path.write_text(str(self.count))
        return SpanExportResult.SUCCESS

    def shutdown(self):
        pass

    def force_flush(self, timeout_millis=30000):
        return True


def tracer_provider(service, folder=None) -> TracerProvider:
    """A provider whose spans are dropped, counted in `folder` (default: SPANS_DIR's, if set)."""
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(DroppingExporter(service, folder or os.environ.get(SPANS_DIR))))
    return provider


def install(service):
    """This process's global provider (once per process: OpenTelemetry keeps the first)."""
    trace.set_tracer_provider(tracer_provider(service))


def _in_pool_process(**_):
    install("worker")


def _pool_process_ends(**_):
    # A pool process ends without running atexit, where the provider would export what it holds.
    provider = trace.get_tracer_provider()
    if isinstance(provider, TracerProvider):
        provider.shutdown()


def configure_processes():
    """From a settings module: every pool process of a Celery worker gets its provider as it starts
    (and exports what it holds as it ends), and the dispatcher now (its command is what this process
    runs)."""
    from celery.signals import worker_process_init, worker_process_shutdown

    worker_process_init.connect(_in_pool_process, weak=False, dispatch_uid="benchmarks.span_sink")
    worker_process_shutdown.connect(_pool_process_ends, weak=False, dispatch_uid="benchmarks.span_sink")
    if "timeouts_dispatcher" in sys.argv:
        install("dispatcher")


def exported(folder) -> int:
    """The spans the exporters writing to `folder` dropped."""
    return sum(int(path.read_text() or 0) for path in Path(folder).glob("*-*"))
