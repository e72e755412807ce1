"""Storage and stack faults against real files, filesystems, services and nats-server."""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import torch

from goodput import schemas, subjects
from goodput.bus import Bus, BusSettings, EmbeddedNats
from goodput.bus.embedded import pid_alive, read_record
from goodput.checkpoint.engine import CheckpointEngine, list_checkpoints, verify_checkpoint
from goodput.checkpoint.format import node_volume
from goodput.owned_process import is_running, terminate
from goodput.state_dir import StateDir
from goodput.tools.chaos import ChaosContext, fire
from goodput.tools.chaos import spec as faults
from goodput.tools.chaos.storage import BALLAST_NAME
from goodput.tools.stack.keeper import kept_service
from goodput.tools.stack.launcher import spawn_service
from goodput.tools.stack.record import StackRecord, write_stack
from goodput.tools.stack.session import StackSession
from tests.chaos.conftest import VictimJob
from tests.chaos.processes import HealthTap, start_hostmon
from tests.conftest import tmpfs_mount

MIB = 1 << 20


async def test_fill_disk_fills_the_volume_filesystem_and_clears(
    victim_job: VictimJob, tmp_path: Path
):
    node_dir = StateDir(victim_job.state_dir).node("node-0")
    with tmpfs_mount(node_dir, "8m"):
        health = await HealthTap(victim_job.bus, victim_job.job).start()
        victim_job.extra.append(
            start_hostmon(
                victim_job.url,
                victim_job.state_dir,
                victim_job.job,
                "node-0",
                "disk_min_free_bytes=2097152",
                "disk_min_free_fraction=0.0",
                "health_interval_s=600",
            )
        )
        assert (await health.wait_for(lambda r: True)).healthy
        ctx = victim_job.context()
        outcome = await fire(faults.FillDisk(node="node-0", free_mib=1), ctx)
        assert outcome.ok, outcome.detail
        volume = node_volume(victim_job.state_dir, "node-0", victim_job.job)
        assert shutil.disk_usage(volume).free < 1 * MIB
        assert (volume / BALLAST_NAME).stat().st_size > 6 * MIB
        with pytest.raises(OSError, match="No space left"):
            (volume / "step-0000000001.bin").write_bytes(bytes(2 * MIB))
        (volume / "step-0000000001.bin").unlink()
        report = await health.wait_for(lambda r: "disk_full" in r.faults)
        assert report.disk_free_bytes < 2 * MIB

        cleared = await fire(faults.FillDisk(node="node-0", clear=True), ctx)
        assert cleared.ok and "ballast removed" in cleared.detail
        assert shutil.disk_usage(volume).free > 7 * MIB
        assert (await health.wait_for(lambda r: r.healthy)).faults == []


async def test_corrupt_checkpoint_flips_a_byte_only_verification_sees(victim_job: VictimJob):
    volume = node_volume(victim_job.state_dir, "node-1", victim_job.job)
    with CheckpointEngine(volume) as engine:
        for step in (1, 2):
            result = engine.save({"w": torch.arange(4096, dtype=torch.float32) * step}, step).wait()
            assert result.ok
    assert verify_checkpoint(volume, 2) == []

    outcome = await fire(faults.CorruptCheckpoint(node="node-1"), victim_job.context())
    assert outcome.ok and outcome.detail.startswith("step 2:")
    problems = verify_checkpoint(volume, 2)
    assert problems, "the flipped byte must fail its checksum"
    assert [info.complete for info in list_checkpoints(volume)] == [True, True], "sizes unchanged"
    assert verify_checkpoint(volume, 1) == []


async def test_corrupt_checkpoint_without_checkpoints_is_an_error(victim_job: VictimJob):
    outcome = await fire(faults.CorruptCheckpoint(node="node-0"), victim_job.context())
    assert not outcome.ok and "no complete checkpoint" in outcome.detail


async def test_kill_service_kills_a_real_service_of_the_stack(
    tmp_path: Path, nats_server: EmbeddedNats, bus: Bus
):
    state_dir = tmp_path / "stack"
    service = spawn_service(
        "hostmon", "node-0", job="svc", url=nats_server.url, paths=StateDir(state_dir), extra=[]
    )
    write_stack(
        state_dir,
        StackRecord(
            job="svc", url=nats_server.url, embedded=False, nodes=["node-0"], services=[service]
        ),
    )
    health = await HealthTap(bus, "svc").start()
    await health.wait_for(lambda r: True)
    ctx = ChaosContext.open(state_dir)
    try:
        unknown = await fire(faults.KillService(service="sensor"), ctx)
        assert not unknown.ok and "hostmon@node-0" in unknown.detail
        hostmon = kept_service(service.process)
        assert hostmon is not None
        outcome = await fire(faults.KillService(service="hostmon", node="node-0"), ctx)
        assert outcome.ok and outcome.target == "hostmon@node-0"
        assert f"pid {hostmon.pid}" in outcome.detail
        for _ in range(500):
            if not is_running(hostmon):
                break
            await asyncio.sleep(0.01)
        assert not is_running(hostmon)
        assert is_running(service.process), "its keeper stays, to start it again"
        terminate(service.process, group=True)
        again = await fire(faults.KillService(service="hostmon", node="node-0"), ctx)
        assert not again.ok and "not running" in again.detail
    finally:
        await ctx.close()
        terminate(service.process, group=True)


async def test_restart_nats_keeps_port_and_store(tmp_path: Path):
    state_dir = tmp_path / "stack"
    state_dir.mkdir()
    first = EmbeddedNats(StateDir(state_dir), detach=True).start()
    try:
        bus = await Bus.connect(BusSettings(url=first.url), name="before")
        await bus.provision()
        await bus.emit(
            schemas.StepDone(
                job="n", node="node-0", rank=0, step=1, step_time_s=1.0, tokens=1, loss=1.0
            )
        )
        await bus.close()

        outcome = await fire(faults.RestartNats(down_s=0.2), ChaosContext.open(state_dir))
        assert outcome.ok, outcome.detail
        second = read_record(StateDir(state_dir))
        assert second is not None and second.pids != [first.pid]
        assert second.servers[0].port == first.port
        assert not pid_alive(first.pid)

        bus = await Bus.connect(BusSettings(url=second.url), name="after")
        info = await bus.js.stream_info(subjects.EVENTS_STREAM)
        assert info.state.messages == 1, "the restarted server kept its JetStream store"
        await bus.close()
    finally:
        StackSession(state_dir).stop()
        if pid_alive(first.pid):
            subprocess.run(["kill", "-9", str(first.pid)], check=False)


async def test_restart_nats_without_an_embedded_server_is_an_error(tmp_path: Path):
    outcome = await fire(faults.RestartNats(), ChaosContext.open(tmp_path))
    assert not outcome.ok and "no embedded nats-server" in outcome.detail


@pytest.mark.slow  # the `goodput` CLI starts slowly (other subcommands import torch)
def test_help_explains_every_fault():
    from tests.conftest import goodput_cli

    text = goodput_cli("chaos", "--help").stdout
    for kind in faults.FAULTS_BY_KIND:
        assert kind in text and faults.describe(kind).split()[0] in text
    assert signal.SIGKILL.name in text
