"""The host monitor as a real process against a real nats-server (this machine has no GPU)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from goodput import schemas, subjects
from goodput.bus import Bus, EmbeddedNats
from tests.chaos.processes import (
    HealthTap,
    put_job_status,
    start_hostmon,
    start_rank,
)
from tests.conftest import tmpfs_mount
from tests.processes import kill, stop
from tests.stack.helpers import EventTap

JOB = "hm"


@pytest.fixture
def processes():
    started: list[subprocess.Popen] = []
    yield started
    stop(*started, timeout_s=10)


async def inject(bus: Bus, tap: EventTap, node: str, fault: str, detail: str = "", clear=False):
    command = schemas.InjectFault(job=JOB, node=node, fault=fault, detail=detail, clear=clear)
    await bus.send_command(subjects.node_target("hostmon", node), command)
    return await tap.result_of(command, timeout_s=20)


async def test_reports_disk_memory_ranks_and_no_gpu(
    bus: Bus, nats_server: EmbeddedNats, tmp_path: Path, processes
):
    ranks = [start_rank(JOB, "node-0", r) for r in (0, 1)]
    other_node = start_rank(JOB, "node-1", 2)
    processes += [*ranks, other_node]
    await put_job_status(bus, JOB, {"node-0": [p.pid for p in ranks], "node-1": [other_node.pid]})
    tap = await HealthTap(bus, JOB).start()
    processes.append(
        start_hostmon(nats_server.url, tmp_path / "state", JOB, "node-0", "health_interval_s=0.5")
    )
    report = await tap.wait_for(lambda r: r.ranks_expected == 2 and r.ranks_alive == 2)
    assert report.node == "node-0" and report.healthy and report.faults == []
    assert report.gpu_available is False and "no NVIDIA driver or GPU" in report.detail
    assert 0 < report.disk_free_bytes <= report.disk_total_bytes
    assert 0 < report.mem_available_bytes <= report.mem_total_bytes

    kill(ranks[1])
    dropped = await tap.wait_for(lambda r: r.ranks_alive == 1)
    assert dropped.ranks_expected == 2


async def test_no_ranks_expected_when_the_job_is_not_running(
    bus: Bus, nats_server: EmbeddedNats, tmp_path: Path, processes
):
    await put_job_status(bus, JOB, {"node-0": [999_999]}, state="finished")
    tap = await HealthTap(bus, JOB).start()
    processes.append(
        start_hostmon(nats_server.url, tmp_path / "state", JOB, "node-0", "health_interval_s=0.5")
    )
    report = await tap.wait_for(lambda r: True)
    assert report.ranks_expected == 0 and report.ranks_alive == 0


async def test_injected_faults_appear_at_once_and_clear(
    bus: Bus, nats_server: EmbeddedNats, tmp_path: Path, processes
):
    events = await EventTap(bus, JOB).start()
    health = await HealthTap(bus, JOB).start()
    processes.append(
        start_hostmon(
            nats_server.url,
            tmp_path / "state",
            JOB,
            "node-0",
            "enable_fault_injection=true",
            # a period far longer than the test: any report after the first is fault-driven
            "health_interval_s=600",
        )
    )
    await health.wait_for(lambda r: r.healthy)

    result = await inject(bus, events, "node-0", "gpu_xid", "79")
    assert result.ok and "gpu_xid:79" in result.detail
    report = await health.wait_for(lambda r: not r.healthy)
    assert report.faults == ["gpu_xid:79"] and "injected" in report.detail

    assert (await inject(bus, events, "node-0", "disk_full")).ok
    report = await health.wait_for(lambda r: "disk_full" in r.faults)
    assert report.faults == ["disk_full", "gpu_xid:79"]

    assert (await inject(bus, events, "node-0", "gpu_xid", clear=True)).ok
    assert (await health.wait_for(lambda r: "gpu_xid:79" not in r.faults)).faults == ["disk_full"]
    assert (await inject(bus, events, "node-0", "all", clear=True)).ok
    assert (await health.wait_for(lambda r: r.healthy)).faults == []

    unknown = await inject(bus, events, "node-0", "cosmic_ray")
    assert not unknown.ok and "unknown host fault" in unknown.detail
    elsewhere = schemas.InjectFault(job=JOB, node="node-7", fault="disk_full")
    await bus.send_command(subjects.node_target("hostmon", "node-0"), elsewhere)
    assert not (await events.result_of(elsewhere)).ok
    await events.stop()


async def test_injection_disabled_is_rejected(
    bus: Bus, nats_server: EmbeddedNats, tmp_path: Path, processes
):
    events = await EventTap(bus, JOB).start()
    health = await HealthTap(bus, JOB).start()
    processes.append(
        start_hostmon(nats_server.url, tmp_path / "state", JOB, "node-0", "health_interval_s=0.5")
    )
    await health.wait_for(lambda r: True)
    result = await inject(bus, events, "node-0", "gpu_xid", "79")
    assert not result.ok and result.detail.startswith("fault injection disabled")
    health.mark()
    report = await health.wait_for(lambda r: True)
    assert report.healthy and report.faults == []
    await events.stop()


@pytest.fixture
def small_tmpfs(tmp_path: Path):
    with tmpfs_mount(tmp_path / "tmpfs", "8m") as mountpoint:
        yield mountpoint


async def test_a_really_full_volume_is_disk_full(
    bus: Bus, nats_server: EmbeddedNats, tmp_path: Path, small_tmpfs: Path, processes
):
    health = await HealthTap(bus, JOB).start()
    processes.append(
        start_hostmon(
            nats_server.url,
            tmp_path / "state",
            JOB,
            "node-0",
            f"volume='{small_tmpfs}'",
            "disk_min_free_bytes=2097152",
            "disk_min_free_fraction=0.0",
            "health_interval_s=600",
        )
    )
    first = await health.wait_for(lambda r: True)
    assert first.healthy and first.disk_total_bytes == 8 << 20
    with open(small_tmpfs / "filler", "wb") as filler:
        filler.write(bytes(7 << 20))
    full = await health.wait_for(lambda r: "disk_full" in r.faults)
    assert full.disk_free_bytes < 2 << 20 and not full.healthy
    (small_tmpfs / "filler").unlink()
    assert (await health.wait_for(lambda r: r.healthy)).faults == []


async def test_memory_below_its_threshold_is_memory_pressure(
    bus: Bus, nats_server: EmbeddedNats, tmp_path: Path, processes
):
    health = await HealthTap(bus, JOB).start()
    processes.append(
        start_hostmon(
            nats_server.url,
            tmp_path / "state",
            JOB,
            "node-0",
            # no host keeps 99.99 % of its memory free: the real reading is below the line
            "memory_min_available_fraction=0.9999",
        )
    )
    report = await health.wait_for(lambda r: True)
    assert report.faults == ["memory_pressure"] and not report.healthy
    assert report.mem_available_bytes < 0.9999 * report.mem_total_bytes


def test_bad_options_stop_the_service_with_a_message(tmp_path: Path):
    result = subprocess.run(
        [
            *(sys.executable, "-m", "goodput_services.hostmon", "--job", JOB, "--node", "node-0"),
            *("--nats-url", "nats://127.0.0.1:1", "--set", "health_interval_seconds=2"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "health_interval_seconds" in result.stderr
