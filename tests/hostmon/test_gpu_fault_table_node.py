"""A real host monitor process on a FakeNvml node, its reports judged by the real sensor and
controller: an application XID restarts the job and keeps the node, then clears by itself;
XID 79 and the driver's reboot request replace the node."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

from goodput import schemas
from goodput.bus import Bus, EmbeddedNats
from goodput.supervisor.control.engine import Controller
from goodput.supervisor.detect.detector import Detector
from tests.chaos.processes import HealthTap, start_hostmon
from tests.controller.helpers import JOB, at, job
from tests.hostmon.fake_gpu_node import add_xid, set_recovery_action
from tests.processes import stop

ROOT = Path(__file__).resolve().parents[2]
#: how long an application XID stays reported without recurring (the option under test)
HEALTHY_INTERVAL_S = 3.0


@pytest.fixture
def fake_node(nats_server: EmbeddedNats, tmp_path: Path, monkeypatch):
    """A host monitor of ``n3`` with two fake GPUs; yields (xids file, recovery file)."""
    xids, recovery = tmp_path / "xids", tmp_path / "recovery"
    monkeypatch.setenv("GOODPUT_FAKE_XIDS", str(xids))
    monkeypatch.setenv("GOODPUT_FAKE_RECOVERY", str(recovery))
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    )
    started: list[subprocess.Popen] = [
        start_hostmon(
            nats_server.url,
            tmp_path / "state",
            JOB,
            "n3",
            "nvml_module=tests.hostmon.fake_gpu_node:nvml",
            "probe_interval_s=0.2",
            # no periodic report within the test: every report after the first is a change
            "health_interval_s=600",
            f"xid_healthy_interval_s={HEALTHY_INTERVAL_S}",
        )
    ]
    yield xids, recovery
    stop(*started, timeout_s=10)


async def test_application_xid_keeps_the_node_and_clears_xid_79_replaces_it(
    bus: Bus, fake_node
) -> None:
    xids, recovery = fake_node
    health = await HealthTap(bus, JOB).start()
    detector, controller, state = Detector(JOB), Controller(), job(spares=1)
    first = await health.wait_for(lambda r: r.gpu_available and len(r.gpus) == 2)
    assert first.healthy and [g.recovery_action for g in first.gpus] == ["none", "none"]

    loop = asyncio.get_running_loop()
    written = loop.time()  # the probe sees the XID after this (both clocks are monotonic)
    add_xid(xids, 1, 13)  # an illegal memory access in the application
    faulted = await health.wait_for(lambda r: "gpu_xid:13" in r.faults)
    (signal,) = detector.on_event(faulted, at(1))
    outcome = controller.handle(state, signal, at(1))
    assert outcome.decision is not None and outcome.decision.rule == "gpu-app-fault"
    assert [type(c) for c in outcome.commands] == [schemas.Restart]
    state = outcome.state
    assert state.role_of("n3") == "active" and state.spares == ["s0"]

    cleared = await health.wait_for(lambda r: r.healthy)
    assert loop.time() - written >= HEALTHY_INTERVAL_S  # not before the healthy interval
    assert cleared.gpus[1].xid_errors == []
    (returned,) = detector.on_event(cleared, at(20))
    assert returned.signal == "node_returned"
    assert controller.handle(state, returned, at(20)).decision.rule == "node-healthy"  # type: ignore[union-attr]

    add_xid(xids, 0, 79)
    set_recovery_action(recovery, 0, "node_reboot")
    lost = await health.wait_for(
        lambda r: "gpu_xid:79" in r.faults and r.gpus[0].recovery_action == "node_reboot"
    )
    (signal,) = [s for s in detector.on_event(lost, at(30)) if s.signal == "degraded_host"]
    outcome = controller.handle(state, signal, at(30))
    assert outcome.decision is not None and outcome.decision.rule == "hot-swap"
    # XID 79 outlives the healthy interval: only a reboot (a new host monitor) forgets it
    await asyncio.sleep(HEALTHY_INTERVAL_S + 1.0)
    set_recovery_action(recovery, 1, "gpu_reset")
    later = await health.wait_for(lambda r: r.gpus[1].recovery_action == "gpu_reset")
    assert "gpu_xid:79" in later.faults
