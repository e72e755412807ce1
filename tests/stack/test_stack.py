"""The stack as separate processes: up/status/down, a killed service, a restarted NATS server."""

from __future__ import annotations

import asyncio
import os
import signal
import stat
from pathlib import Path

import pytest

from goodput import schemas
from goodput.bus import Bus, BusSettings, EmbeddedNats
from goodput.bus.embedded import pid_alive, read_record
from goodput.checkpoint.format.job_key import KEY_FILE_ENV
from goodput.state_dir import StateDir
from goodput.tools.stack.keeper import kept_service
from goodput.tools.stack.record import read_stack
from tests.conftest import goodput_cli
from tests.stack.conftest import stack_status
from tests.stack.helpers import wait_for_results

JOB = "job-a"


def _threshold_commands(count: int, base: float) -> list[schemas.SetThresholds]:
    return [
        schemas.SetThresholds(job=JOB, values={"heartbeat_timeout_s": base + i})
        for i in range(count)
    ]


def test_up_reports_every_service_healthy_and_down_stops_them(stack: Path) -> None:
    status = stack_status(stack)
    names = {s["name"] for s in status["services"]}
    assert names == {"sensor", "controller", "actuator", "hostmon@node-0", "replicator@node-0"}
    assert all(s["healthy"] for s in status["services"]), status
    record = read_stack(stack)
    assert record is not None
    # the job's checkpoint key: made private in the state directory, handed to every service
    key_file = StateDir(stack).ckpt_key
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    for service in record.services:
        environ = Path(f"/proc/{service.pid}/environ").read_bytes().split(b"\0")
        assert f"{KEY_FILE_ENV}={key_file}".encode() in environ, service.key
    nats_pid = read_record(StateDir(stack)).servers[0].pid  # type: ignore[union-attr]
    assert StateDir(stack).nats_store().is_dir()
    goodput_cli("down", "--state-dir", str(stack))
    assert not any(pid_alive(s.pid) for s in record.services)
    assert not pid_alive(nats_pid)


def test_up_with_no_nodes_starts_the_central_services_only(tmp_path: Path) -> None:
    """Where node agents run each node's host monitor and replicator (Slurm, Kubernetes)."""
    state_dir = tmp_path / "stack"
    goodput_cli("up", "--state-dir", str(state_dir), "--job", JOB, "--nodes", "0", "--wait", "20")
    try:
        record = read_stack(state_dir)
        assert record is not None and record.nodes == []
        assert {s.key for s in record.services} == {"sensor", "controller", "actuator"}
        assert all(s["healthy"] for s in stack_status(state_dir)["services"])
    finally:
        goodput_cli("down", "--state-dir", str(state_dir), check=False)


def test_up_is_idempotent(stack: Path) -> None:
    before = {s.key: s.pid for s in read_stack(stack).services}  # type: ignore[union-attr]
    goodput_cli("up", "--state-dir", str(stack), "--job", JOB, "--wait", "20")
    after = {s.key: s.pid for s in read_stack(stack).services}  # type: ignore[union-attr]
    assert before == after


@pytest.mark.slow
async def test_a_killed_service_resumes_its_durable_consumer(stack: Path) -> None:
    """SIGKILL the sensor: its keeper starts it again, and it resumes its durable consumer."""
    record = read_stack(stack)
    assert record is not None
    sensor = next(s for s in record.services if s.name == "sensor")
    killed = kept_service(sensor.process)
    assert killed is not None
    os.kill(killed.pid, signal.SIGKILL)
    bus = await Bus.connect(BusSettings(url=record.url), name="test")
    try:
        commands = _threshold_commands(10, 5.0)
        for command in commands:
            await bus.send_command("sensor", command)
        ids = {c.command_id for c in commands}
        counts = await wait_for_results(bus, JOB, ids)
        assert {i: counts[i] for i in ids} == dict.fromkeys(ids, 1)
        restarted = kept_service(sensor.process)
        assert restarted is not None and restarted.pid != killed.pid
    finally:
        await bus.close()


@pytest.mark.slow
async def test_nats_restart_loses_no_command_and_runs_none_twice(stack: Path) -> None:
    record = read_stack(stack)
    recorded = read_record(StateDir(stack))
    server = recorded.servers[0] if recorded else None
    assert record is not None and server is not None
    bus = await Bus.connect(BusSettings(url=record.url), name="test")
    try:
        before = _threshold_commands(20, 5.0)
        for command in before:
            await bus.send_command("sensor", command)
        os.kill(server.pid, signal.SIGKILL)  # hard kill: no flush, no goodbye
        during = _threshold_commands(20, 50.0)
        sending = asyncio.gather(*(bus.send_command("sensor", c) for c in during))
        await asyncio.sleep(2.0)
        restarted = EmbeddedNats(StateDir(stack), port=server.port, detach=True)
        restarted.start()
        await asyncio.wait_for(sending, timeout=60)
        after = _threshold_commands(20, 100.0)
        for command in after:
            await bus.send_command("sensor", command)
        ids = {c.command_id for c in before + during + after}
        counts = await wait_for_results(bus, JOB, ids, timeout_s=60)
        assert {i: counts[i] for i in ids} == dict.fromkeys(ids, 1)
        for _ in range(40):
            status = stack_status(stack)
            if all(s["healthy"] for s in status["services"]):
                break
            await asyncio.sleep(0.5)
        assert all(s["healthy"] for s in status["services"]), status
    finally:
        await bus.close()
