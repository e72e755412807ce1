"""OpenTelemetry set-up and trace context carried in NATS message headers.

Exporters follow the standard environment variables: ``OTEL_TRACES_EXPORTER`` /
``OTEL_METRICS_EXPORTER`` = ``console``, ``otlp`` or ``none`` (the default, so an idle
laptop prints nothing), ``OTEL_EXPORTER_OTLP_ENDPOINT`` and friends for OTLP.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from opentelemetry import context, propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

_configured = False


def setup_tracing(service_name: str, exporter: SpanExporter | None = None) -> None:
    """Install a tracer provider for this process once; ``exporter`` overrides the env choice."""
    global _configured
    if _configured:
        return
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    chosen = exporter or _exporter_from_env()
    if chosen is not None:
        provider.add_span_processor(BatchSpanProcessor(chosen))
    trace.set_tracer_provider(provider)
    _configured = True


def _exporter_from_env() -> SpanExporter | None:
    name = os.environ.get("OTEL_TRACES_EXPORTER", "none").strip().lower()
    if name == "console":
        return ConsoleSpanExporter()
    if name == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    return None


def tracer(name: str) -> trace.Tracer:
    return trace.get_tracer(name)


def inject_headers(headers: dict[str, str] | None = None) -> dict[str, str]:
    """The current trace context as message headers (W3C ``traceparent``)."""
    carrier: dict[str, str] = dict(headers or {})
    propagate.inject(carrier)
    return carrier


def extract_context(headers: Mapping[str, str] | None) -> context.Context:
    return propagate.extract(dict(headers or {}))
