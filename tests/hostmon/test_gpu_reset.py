"""GPU reset by the host monitor process: real nats-server, real host monitor, real rank
processes; the GPUs are a FakeNvml (``fake_gpu_node``) and nvidia-smi is FakeNvidiaSmi."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import psutil
import pytest

from goodput import schemas, subjects
from goodput.bus import Bus, EmbeddedNats
from tests.chaos.processes import HealthTap, put_job_status, start_hostmon, start_rank
from tests.hostmon.fake_gpu_node import add_xid, hold_gpu
from tests.processes import stop
from tests.stack.helpers import EventTap

JOB = "hm-reset"
ROOT = Path(__file__).resolve().parents[2]
FAKE_NVIDIA_SMI = Path(__file__).with_name("fake_nvidia_smi.py")


@pytest.fixture
def processes():
    started: list[subprocess.Popen] = []
    yield started
    stop(*started, timeout_s=10)


@pytest.fixture
def node(bus: Bus, nats_server: EmbeddedNats, tmp_path: Path, processes, monkeypatch):
    """Start a host monitor of node-0 with two fake GPUs; returns (xids file, smi log, start)."""
    xids, smi_log = tmp_path / "xids", tmp_path / "nvidia-smi.log"
    monkeypatch.setenv("GOODPUT_FAKE_XIDS", str(xids))
    monkeypatch.setenv("GOODPUT_FAKE_GPU_HOLDERS", str(tmp_path / "holders"))
    monkeypatch.setenv("GOODPUT_FAKE_NVIDIA_SMI_LOG", str(smi_log))
    # the fake NVML module is imported by the host monitor process from the repository root
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    )

    def start(mode: str = "ok", timeout_s: float = 60.0, period_s: float = 600) -> Path:
        monkeypatch.setenv("GOODPUT_FAKE_NVIDIA_SMI", mode)
        state = tmp_path / "state"
        processes.append(
            start_hostmon(
                nats_server.url,
                state,
                JOB,
                "node-0",
                "nvml_module=tests.hostmon.fake_gpu_node:nvml",
                f"nvidia_smi='{FAKE_NVIDIA_SMI}'",
                f"gpu_reset_timeout_s={timeout_s}",
                f"health_interval_s={period_s}",
            )
        )
        return state / "hostmon-node-0.log"

    return xids, smi_log, start


async def _stopped_rank_status(bus: Bus, attempt: int = 1) -> None:
    """The actuator's status after it stopped the node's ranks: pids that no longer run."""
    rank = start_rank(JOB, "node-0", 0)
    stop(rank, timeout_s=10)
    await put_job_status(
        bus, JOB, {"node-0": [rank.pid]}, state="restarting", attempt=attempt, run_id="run-2"
    )


async def _reset(bus: Bus, tap: EventTap, gpus: list[int], attempt: int = 1, run_id: str = "run-2"):
    command = schemas.ResetGpu(job=JOB, node="node-0", gpus=gpus, attempt=attempt, run_id=run_id)
    await bus.send_command(subjects.node_target("hostmon", "node-0"), command)
    result = await tap.result_of(command, timeout_s=30)
    event = await tap.wait_for(
        lambda e: isinstance(e, schemas.GpuReset) and e.command_id == command.command_id
    )
    return result, event


def _running_fakes() -> list[psutil.Process]:
    running = []
    for process in psutil.process_iter(["cmdline", "status"]):
        cmdline = process.info["cmdline"] or []
        if process.info["status"] != psutil.STATUS_ZOMBIE and str(FAKE_NVIDIA_SMI) in cmdline:
            running.append(process)
    return running


async def _xid_reported(health: HealthTap, xids: Path) -> None:
    """The monitor's first report (two healthy GPUs), then XID 48 on GPU 1 reported."""
    await health.wait_for(lambda r: r.gpu_available and len(r.gpus) == 2)
    add_xid(xids, 1, 48)
    report = await health.wait_for(lambda r: "gpu_xid:48" in r.faults)
    assert report.gpus[1].xid_errors == [48] and not report.gpus[0].xid_errors


async def test_a_reset_clears_the_gpu_fault(bus: Bus, node) -> None:
    xids, smi_log, start = node
    # subscribed before the monitor starts: its first report is its only one for 600 s, and a
    # tap that subscribed after it (the rank's start and stop take long on a loaded machine)
    # waited 20 s for nothing
    health = await HealthTap(bus, JOB).start()
    start("ok")
    await _stopped_rank_status(bus)
    tap = await EventTap(bus, JOB).start()
    await _xid_reported(health, xids)

    result, event = await _reset(bus, tap, [1])
    assert result.ok and "GPU reset succeeded" in result.detail
    assert event.outcome == "succeeded" and event.gpus == [1] and event.attempt == 1
    assert event.duration_s > 0
    assert smi_log.read_text().split(maxsplit=1)[1] == "--gpu-reset -i 1\n"
    assert (await health.wait_for(lambda r: r.healthy)).faults == []
    await tap.stop()


async def test_a_failed_reset_keeps_the_fault_and_says_why(bus: Bus, node) -> None:
    xids, _, start = node
    health = await HealthTap(bus, JOB).start()
    start("fail", period_s=0.5)
    await _stopped_rank_status(bus)
    tap = await EventTap(bus, JOB).start()
    await _xid_reported(health, xids)

    result, event = await _reset(bus, tap, [])  # every GPU: it stops at the first failure
    assert not result.ok and event.outcome == "failed" and event.gpus == [0, 1]
    assert "exited 1" in event.detail and "In use by another client" in event.detail
    health.mark()
    assert (await health.wait_for(lambda r: True)).faults == ["gpu_xid:48"]
    await tap.stop()


async def test_a_reset_past_its_deadline_is_killed_and_timed_out(bus: Bus, node) -> None:
    start = node[2]
    start("hang", timeout_s=3.0)
    await _stopped_rank_status(bus)
    tap = await EventTap(bus, JOB).start()

    result, event = await _reset(bus, tap, [0])
    assert not result.ok and event.outcome == "timed_out"
    assert event.duration_s >= 3.0 and "still running after 3 s; killed" in event.detail
    assert not _running_fakes(), "the hung nvidia-smi was left running"
    await tap.stop()


async def test_a_reset_for_an_old_attempt_is_ignored_with_a_log_line(bus: Bus, node) -> None:
    _, smi_log, start = node
    log = start("ok")
    await _stopped_rank_status(bus, attempt=2)
    tap = await EventTap(bus, JOB).start()

    result, event = await _reset(bus, tap, [1], attempt=1)
    assert not result.ok and event.outcome == "ignored"
    assert "attempt 1 is stale: the job is at attempt 2" in event.detail
    assert "GPU reset ignored: reset for attempt 1 is stale" in log.read_text()
    # attempts count from 1 in every run: an attempt of an earlier run is stale too
    result, event = await _reset(bus, tap, [1], attempt=2, run_id="run-1")
    assert not result.ok and event.outcome == "ignored"
    assert "reset for run run-1 is stale: run run-2 is the job's now" in event.detail
    assert not smi_log.exists()  # nvidia-smi never ran
    await tap.stop()


async def test_no_reset_while_a_rank_still_runs_on_the_node(bus: Bus, node, processes) -> None:
    _, smi_log, start = node
    start("ok")
    rank = start_rank(JOB, "node-0", 0)
    processes.append(rank)
    await put_job_status(bus, JOB, {"node-0": [rank.pid]})
    tap = await EventTap(bus, JOB).start()

    result, event = await _reset(bus, tap, [0])
    assert not result.ok and event.outcome == "ignored"
    assert "1 rank(s) of attempt 1 still run on node-0" in event.detail
    assert not smi_log.exists()
    await tap.stop()


async def test_no_reset_while_nvml_sees_a_process_on_the_gpu(
    bus: Bus, node, processes, tmp_path: Path
) -> None:
    """The Kubernetes shape: the job status lists no pids (the ranks are pods), so only the
    driver can tell that a rank still holds the GPU; the reset is refused naming its pid."""
    _, smi_log, start = node
    log = start("ok")
    rank = start_rank(JOB, "node-0", 0)
    processes.append(rank)
    hold_gpu(tmp_path / "holders", 1, rank.pid)
    await put_job_status(bus, JOB, {}, state="restarting", run_id="run-2")
    tap = await EventTap(bus, JOB).start()

    result, event = await _reset(bus, tap, [])
    assert not result.ok and event.outcome == "ignored" and event.gpus == [0, 1]
    name = psutil.Process(rank.pid).name()
    assert event.detail == f"GPU 1 is still held by pid {rank.pid} ({name})"
    assert f"GPU reset ignored: GPU 1 is still held by pid {rank.pid}" in log.read_text()
    assert not smi_log.exists()  # nvidia-smi never ran

    stop(rank, timeout_s=10)  # the driver frees the GPU with the process
    result, event = await _reset(bus, tap, [1])
    assert result.ok and event.outcome == "succeeded" and event.gpus == [1]
    await tap.stop()


async def test_without_nvml_there_is_nothing_to_reset(
    bus: Bus, nats_server: EmbeddedNats, tmp_path: Path, processes
) -> None:
    """This machine's real path: no driver, so the reset fails at once and says why."""
    processes.append(start_hostmon(nats_server.url, tmp_path / "state", JOB, "node-0"))
    tap = await EventTap(bus, JOB).start()
    result, event = await _reset(bus, tap, [])
    assert not result.ok and event.outcome == "failed"
    assert "NVML sees no GPU on node-0 to reset" in event.detail
    await tap.stop()
