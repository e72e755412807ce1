"""An in-memory span exporter on this process's tracer provider (one provider per process)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_exporter: InMemorySpanExporter | None = None


def _process_exporter() -> InMemorySpanExporter:
    """OpenTelemetry allows one global provider per process: install it once, reuse it."""
    global _exporter
    if _exporter is None:
        provider = trace.get_tracer_provider()
        if not isinstance(provider, TracerProvider):
            provider = TracerProvider(resource=Resource.create({"service.name": "goodput-test"}))
            trace.set_tracer_provider(provider)
        _exporter = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(_exporter))
    return _exporter


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = _process_exporter()
    exporter.clear()
    yield exporter
    exporter.clear()
