"""The demo project's settings with tracing on: OpenTelemetry's SDK, a BatchSpanProcessor and an
exporter that drops the spans, in the dispatcher and in every pool process of the worker
(benchmarks/span_sink.py). The `tracing` scenario runs its worker and dispatcher with these settings
beside the same processes with the project's own, which configure no tracer provider."""

from benchmarks import span_sink
from project.settings import *  # noqa: F403

span_sink.configure_processes()
