"""OpenTelemetry set-up and trace context carried in NATS message headers.

Exporters follow the standard environment variables: ``OTEL_TRACES_EXPORTER`` /
``OTEL_METRICS_EXPORTER`` = ``console``, ``otlp`` or ``none`` (the default, so an idle
laptop prints nothing), ``OTEL_EXPORTER_OTLP_ENDPOINT`` and friends for OTLP,
``OTEL_METRIC_EXPORT_INTERVAL`` for how often metrics leave the process. Metrics may also be
``prometheus``: the process serves them for scraping (:mod:`goodput.prometheus_endpoint`).

A remediation is one trace: the sensor's signal span is its root, and every message sent
while a span is current carries the W3C ``traceparent`` header (:func:`inject_headers`), so
the consumer on the other side continues the trace. Where the context has to cross something
that is not a message — the controller's stored outbox, a rank's environment — it travels as
the same ``traceparent`` string (:func:`current_traceparent`, :func:`context_from_traceparent`).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import os
from collections.abc import Coroutine, Iterator, Mapping
from typing import Any, TypeVar

from opentelemetry import context, metrics, propagate, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    MetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

TRACEPARENT = "traceparent"
#: the values of ``OTEL_METRICS_EXPORTER`` goodput knows (one exporter per process)
METRIC_EXPORTERS = ("none", "console", "otlp", "prometheus")
#: the environment variable that hands a launch's trace context to the rank processes
TRACEPARENT_ENV = "GOODPUT_TRACEPARENT"

T = TypeVar("T")
log = logging.getLogger(__name__)

_configured = False
_meter_provider: MeterProvider | None = None


def exporter_choice(variable: str) -> str:
    """``console``, ``otlp``, ``prometheus`` (metrics) or ``none`` from ``variable``."""
    return os.environ.get(variable, "none").strip().lower() or "none"


def setup_tracing(service_name: str, exporter: SpanExporter | None = None) -> None:
    """Install a tracer provider for this process once; ``exporter`` overrides the env choice.

    A process whose own code already installed an SDK provider (a training script that traces
    itself) keeps it: OpenTelemetry allows one global provider, and it is the user's.
    """
    global _configured
    if _configured or isinstance(trace.get_tracer_provider(), TracerProvider):
        _configured = True
        return
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    chosen = exporter or span_exporter_from_env()
    if chosen is not None:
        provider.add_span_processor(BatchSpanProcessor(chosen))
    trace.set_tracer_provider(provider)
    _configured = True


def span_exporter_from_env() -> SpanExporter | None:
    name = exporter_choice("OTEL_TRACES_EXPORTER")
    if name == "console":
        return ConsoleSpanExporter()
    if name == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter()
    return None


def setup_metrics(
    service_name: str, reader: MetricReader | None = None, *, port_offset: int = 0
) -> MeterProvider | None:
    """Install a meter provider for this process once, if asked for (``reader`` or the env).

    With ``OTEL_METRICS_EXPORTER`` unset or ``none`` nothing is installed: instruments stay the
    API's no-ops, which cost nothing in a training loop. With ``prometheus`` the process serves
    its metrics on the port :func:`goodput.prometheus_endpoint.endpoint_port` gives for
    ``port_offset``; a port it cannot bind is one log line, and nothing is installed.
    """
    global _meter_provider
    if _meter_provider is not None:
        return _meter_provider
    if isinstance(metrics.get_meter_provider(), MeterProvider):
        return None  # the process's own code installed one; it stays the only one
    if reader is None:
        reader = metric_reader_from_env(port_offset)
        if reader is None:
            return None
    _meter_provider = MeterProvider(
        metric_readers=[reader], resource=Resource.create({"service.name": service_name})
    )
    metrics.set_meter_provider(_meter_provider)
    return _meter_provider


def metric_reader_from_env(port_offset: int) -> MetricReader | None:
    """The reader ``OTEL_METRICS_EXPORTER`` asks for: a Prometheus endpoint or a periodic push."""
    name = exporter_choice("OTEL_METRICS_EXPORTER")
    if name == "prometheus":
        from goodput.prometheus_endpoint import serve_prometheus

        return serve_prometheus(port_offset)
    if name not in METRIC_EXPORTERS:  # a typo or a list: said, not silently dropped
        log.warning(
            "OTEL_METRICS_EXPORTER=%r names none of %s: metrics not exported",
            name,
            ", ".join(METRIC_EXPORTERS),
        )
        return None
    exporter = metric_exporter_from_env()
    return PeriodicExportingMetricReader(exporter) if exporter is not None else None


def metric_exporter_from_env() -> MetricExporter | None:
    """The push exporter ``OTEL_METRICS_EXPORTER`` names (None for ``prometheus``, a pull)."""
    name = exporter_choice("OTEL_METRICS_EXPORTER")
    if name == "console":
        return ConsoleMetricExporter()
    if name == "otlp":
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        return OTLPMetricExporter()
    return None


def flush_metrics() -> None:
    """Export what was recorded now (a short-lived command exits before the next period)."""
    if _meter_provider is not None:
        _meter_provider.force_flush()


def tracer(name: str) -> trace.Tracer:
    return trace.get_tracer(name)


def meter(name: str) -> metrics.Meter:
    return metrics.get_meter(name)


def inject_headers(headers: dict[str, str] | None = None) -> dict[str, str]:
    """The current trace context as message headers (W3C ``traceparent``)."""
    carrier: dict[str, str] = dict(headers or {})
    propagate.inject(carrier)
    return carrier


def extract_context(headers: Mapping[str, str] | None) -> context.Context:
    return propagate.extract(dict(headers or {}))


def current_traceparent() -> str:
    """The current span as a W3C ``traceparent`` string; "" outside any span."""
    return inject_headers().get(TRACEPARENT, "")


def context_from_traceparent(traceparent: str) -> context.Context:
    """A context whose parent is ``traceparent`` (an empty context for "" or garbage)."""
    return extract_context({TRACEPARENT: traceparent} if traceparent else None)


@contextlib.contextmanager
def attached(ctx: context.Context | None) -> Iterator[None]:
    """Make ``ctx`` current for the block (no-op for None)."""
    if ctx is None:
        yield
        return
    token = context.attach(ctx)
    try:
        yield
    finally:
        context.detach(token)


def link_to_current() -> list[trace.Link]:
    """A link to the current span, for a new trace started because of it."""
    span_context = trace.get_current_span().get_span_context()
    return [trace.Link(span_context)] if span_context.is_valid else []


def untraced_task(coro: Coroutine[Any, Any, T], *, name: str | None = None) -> asyncio.Task[T]:
    """A background task outside the current trace (a task copies its creator's context).

    A rank watcher started while relaunching ranks would otherwise report that rank's exit,
    hours later, as part of the remediation that started it.
    """
    ctx = contextvars.copy_context()
    ctx.run(context.attach, context.Context())
    return asyncio.create_task(coro, name=name, context=ctx)
