"""Policies cannot kill the controller: a real controller process with a policy that ``os._exit``\\s
or hangs in ``decide``, against a real nats-server.

Each costs one decision, made by the built-in policy with the reason in ``Decision.error``;
the controller stays up, its health record fresh, and the script decides the next signal in
a new worker. Before the worker process, ``os._exit`` in ``decide`` ended the controller.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from goodput import schemas
from goodput.bus import Bus, BusSettings, EmbeddedNats
from goodput.bus.service_health import read_records
from tests.controller.helpers import spawn_service
from tests.processes import stop
from tests.stack.helpers import EventTap

pytestmark = pytest.mark.slow
JOB = "job-policy-isolation"
TIMEOUT_S = 1.0
POLICY = """
import os
import time

from goodput.policy import Plan


def decide(signal, state):
    if signal.detail == "exit":
        os._exit(3)
    if signal.detail == "hang":
        time.sleep(600)
    return Plan([], "watch", f"noted {signal.detail}")
"""


async def _health(bus: Bus) -> schemas.ServiceHealth:
    """The controller's health record, read as `goodput status` reads it."""
    records, ignored = await read_records(bus, JOB, "controller")
    assert records and not ignored, (records, ignored)
    return max(records, key=lambda record: record.ts)


async def _fresh_and_healthy(bus: Bus) -> schemas.ServiceHealth:
    record = await _health(bus)
    assert record.healthy, record
    assert (time.time_ns() - record.ts) / 1e9 < 3 * record.period_s, record
    return record


async def test_a_policy_that_exits_or_hangs_costs_one_decision(
    tmp_path: Path, nats_server: EmbeddedNats
) -> None:
    script = tmp_path / "policy.py"
    script.write_text(POLICY)
    controller = spawn_service(
        "controller",
        JOB,
        nats_server,
        tmp_path,
        f'policy="{script}"',
        f"settings={{policy_timeout_s={TIMEOUT_S}}}",
    )
    bus = await Bus.connect(BusSettings(url=nats_server.url), name="test")
    await bus.provision()
    tap = await EventTap(bus, JOB).start()

    async def decided(detail: str, node: str = "node-0") -> tuple[schemas.Decision, float]:
        signal = schemas.Signal(job=JOB, signal="crash", node=node, detail=detail)
        sent = time.monotonic()
        await bus.emit(signal)
        decision = await tap.wait_for(
            lambda e: isinstance(e, schemas.Decision) and e.signal_id == signal.signal_id,
            timeout_s=60,
            what=f"the decision on {detail!r}",
        )
        assert isinstance(decision, schemas.Decision)
        return decision, time.monotonic() - sent

    try:
        for _ in range(300):
            try:
                if (await _health(bus)).detail.startswith("leader"):
                    break
            except (AssertionError, Exception):
                pass
            await asyncio.sleep(0.2)
        await bus.emit(
            schemas.JobStatus(
                job=JOB,
                state="running",
                attempt=1,
                world_size=2,
                procs_per_node=1,
                active_nodes=["node-0", "node-1"],
                spare_nodes=["node-2"],
            )
        )
        first, _ = await decided("first")
        assert (first.policy, first.rule, first.error) == ("policy", "watch", "")

        died, _ = await decided("exit", "node-1")
        assert died.policy == "builtin (fallback from policy)", died
        assert "ended its worker process (exit status 3)" in died.error, died.error
        assert controller.poll() is None
        await _fresh_and_healthy(bus)
        after_exit, _ = await decided("after exit")
        assert (after_exit.policy, after_exit.rule, after_exit.error) == ("policy", "watch", "")

        hung, took_s = await decided("hang", "node-1")
        assert hung.policy == "builtin (fallback from policy)", hung
        assert f"did not return within {TIMEOUT_S:g} s" in hung.error, hung.error
        assert TIMEOUT_S <= took_s < TIMEOUT_S + 10, took_s  # one deadline, not a stuck loop
        for _ in range(50):  # the next refresh (every second) counts the second restart
            health = await _fresh_and_healthy(bus)
            if "worker restarted 2x" in health.detail:
                break
            await asyncio.sleep(0.1)
        assert "worker restarted 2x" in health.detail, health.detail
        after_hang, _ = await decided("after hang")
        assert (after_hang.policy, after_hang.rule, after_hang.error) == ("policy", "watch", "")
        assert controller.poll() is None
    finally:
        await tap.stop()
        await bus.close()
        assert stop(controller, timeout_s=90) == [0]
