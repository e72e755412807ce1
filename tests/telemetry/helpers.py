"""Services run in the test's process, so their spans reach the in-memory exporter."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan

from goodput.bus import BusSettings, EmbeddedNats
from goodput.config import ServiceConfig
from goodput_services.base import Service


def service_config(
    job: str, server: EmbeddedNats, state_dir: Path, **options: Any
) -> ServiceConfig:
    return ServiceConfig(
        job=job, state_dir=str(state_dir), bus=BusSettings(url=server.url), options=options
    )


@contextlib.asynccontextmanager
async def running(*services: Service) -> AsyncIterator[list[asyncio.Task[None]]]:
    """The services' real ``run()`` in this event loop; stopped as on SIGTERM afterwards."""
    tasks = [asyncio.create_task(service.run()) for service in services]
    try:
        yield tasks
    finally:
        for service in services:
            service.request_stop()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 90)


def one(spans: list[ReadableSpan], name: str, **where: Any) -> ReadableSpan:
    """The only span called ``name`` whose attributes match ``where``."""
    matching = [
        s
        for s in spans
        if s.name == name and all((s.attributes or {}).get(k) == v for k, v in where.items())
    ]
    names = sorted({s.name for s in spans})
    assert len(matching) == 1, f"{len(matching)} span(s) {name!r} {where}; spans: {names}"
    return matching[0]


def child_of(span: ReadableSpan, parent: ReadableSpan) -> bool:
    return (
        span.parent is not None
        and parent.context is not None
        and span.parent.span_id == parent.context.span_id
    )
