"""`goodput up`'s wait for health on a server too busy to answer a query in time."""

from __future__ import annotations

import io

import nats.errors
import pytest
from rich.console import Console

from goodput.tools.stack import launcher

HEALTHY = [{"name": "sensor", "healthy": True}]


def _quiet() -> Console:
    return Console(file=io.StringIO())


async def test_a_health_query_that_times_out_is_asked_again(monkeypatch) -> None:
    answers: list = [nats.errors.TimeoutError(), TimeoutError(), HEALTHY]

    async def report(settings, job, services):
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(launcher, "service_report", report)
    monkeypatch.setattr(launcher, "check_running", lambda services: None)
    monkeypatch.setattr(launcher.asyncio, "sleep", _no_wait)
    assert await launcher.wait_healthy(None, "job", [], 30, _quiet()) == HEALTHY
    assert answers == []


async def test_a_bus_that_never_answers_ends_in_one_line(monkeypatch) -> None:
    async def report(settings, job, services):
        raise nats.errors.TimeoutError

    monkeypatch.setattr(launcher, "service_report", report)
    monkeypatch.setattr(launcher, "check_running", lambda services: None)
    with pytest.raises(launcher.HealthUnknown, match="did not answer the health query within"):
        await launcher.wait_healthy(None, "job", [], 0.2, _quiet())


async def _no_wait(seconds: float) -> None:
    return None
