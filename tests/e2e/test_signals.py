"""Host faults through the host monitor's fault injection lead to the policy's action."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from goodput import schemas, subjects
from goodput.bus import Bus, BusSettings
from goodput.cli.stack import read_stack
from tests.conftest import goodput_cli
from tests.stack.helpers import EventTap

pytestmark = pytest.mark.slow
JOB = "job-sig"
SLEEPER = "import time; time.sleep(600)"


@pytest.fixture
async def running_job(tmp_path: Path) -> AsyncIterator[tuple[Path, Bus, EventTap]]:
    state = tmp_path / "stack"
    goodput_cli(
        "up",
        "--state-dir",
        str(state),
        "--job",
        JOB,
        "--nodes",
        "3",
        "--wait",
        "30",
        "--service-set",
        "hostmon:enable_fault_injection=true",
    )
    bus = await Bus.connect(BusSettings(url=read_stack(state).url), name="test")  # type: ignore[union-attr]
    tap = await EventTap(bus, JOB).start()
    try:
        await bus.send_command(
            subjects.ACTUATOR,
            schemas.StartJob(
                job=JOB, argv=[sys.executable, "-c", SLEEPER], nodes=2, procs_per_node=1, spares=1
            ),
        )
        await tap.wait_for(lambda e: isinstance(e, schemas.JobStatus) and e.state == "running")
        yield state, bus, tap
    finally:
        await tap.stop()
        await bus.close()
        goodput_cli("down", "--state-dir", str(state), check=False)


async def _remediated(tap: EventTap, node: str) -> tuple[schemas.Signal, schemas.Decision]:
    signal = await tap.wait_for(
        lambda e: isinstance(e, schemas.Signal) and e.signal == "degraded_host" and e.node == node,
        what=f"degraded_host signal for {node}",
    )
    decision = await tap.wait_for(
        lambda e: isinstance(e, schemas.Decision) and e.signal_id == signal.signal_id
    )
    return signal, decision


async def test_a_gpu_xid_swaps_the_node_for_the_spare(running_job) -> None:
    state, _, tap = running_job
    goodput_cli("chaos", "gpu-xid", "--state-dir", str(state), "--job", JOB, "--node", "node-1")
    signal, decision = await _remediated(tap, "node-1")
    assert "gpu_xid" in signal.detail and signal.severity == "uncorrectable"
    assert decision.rule == "hot-swap"
    swapped = await tap.wait_for(
        lambda e: isinstance(e, schemas.JobStatus) and e.attempt == 2 and e.state == "running"
    )
    assert swapped.active_nodes == ["node-0", "node-2"] and "node-1" in swapped.failed_nodes


async def test_a_full_disk_is_a_degraded_host_and_is_acted_on(running_job) -> None:
    state, _, tap = running_job
    goodput_cli(
        "chaos",
        "host-fault",
        "disk_full",
        "--state-dir",
        str(state),
        "--job",
        JOB,
        "--node",
        "node-0",
    )
    signal, decision = await _remediated(tap, "node-0")
    assert "disk_full" in signal.detail
    assert decision.rule in ("hot-swap", "in-job-restart", "scale-down")
    assert decision.command_ids


async def test_a_hung_training_loop_is_restarted(tmp_path: Path) -> None:
    """The real example job: the loop of rank 1 hangs while its heartbeats go on."""
    state = tmp_path / "stack"
    goodput_cli("up", "--state-dir", str(state), "--job", JOB, "--nodes", "2", "--wait", "30")
    bus = await Bus.connect(BusSettings(url=read_stack(state).url), name="test")  # type: ignore[union-attr]
    tap = await EventTap(bus, JOB).start()
    try:
        await bus.send_command(
            subjects.ACTUATOR,
            schemas.StartJob(
                job=JOB,
                argv=[
                    sys.executable,
                    "-m",
                    "goodput.examples.gpt.supervised",
                    "--steps",
                    "100000",
                    "--log-every",
                    "0",
                ],
                nodes=2,
                procs_per_node=1,
                spares=0,
                env={"GOODPUT_ENABLE_FAULT_INJECTION": "1", "GOODPUT_CKPT_EVERY": "10"},
            ),
        )
        await tap.wait_for(
            lambda e: isinstance(e, schemas.StepDone) and e.step >= 15, timeout_s=120
        )
        goodput_cli("chaos", "hang-rank", "--state-dir", str(state), "--job", JOB, "--rank", "1")
        signal = await tap.wait_for(
            lambda e: isinstance(e, schemas.Signal) and e.signal == "hang", timeout_s=90
        )
        decision = await tap.wait_for(
            lambda e: isinstance(e, schemas.Decision) and e.signal_id == signal.signal_id
        )
        assert decision.rule == "in-job-restart"
        await tap.wait_for(
            lambda e: isinstance(e, schemas.JobStatus) and e.attempt == 2 and e.state == "running"
        )
    finally:
        await bus.send_command(subjects.ACTUATOR, schemas.Stop(job=JOB, reason="test done"))
        await tap.stop()
        await bus.close()
        goodput_cli("down", "--state-dir", str(state), check=False)


async def test_a_slowed_rank_is_found_and_evicted(tmp_path: Path) -> None:
    """The real example job with a spare: rank 1 runs at half speed (SIGSTOP/SIGCONT)."""
    state = tmp_path / "stack"
    goodput_cli("up", "--state-dir", str(state), "--job", JOB, "--nodes", "3", "--wait", "30")
    bus = await Bus.connect(BusSettings(url=read_stack(state).url), name="test")  # type: ignore[union-attr]
    tap = await EventTap(bus, JOB).start()
    try:
        await bus.send_command(
            subjects.ACTUATOR,
            schemas.StartJob(
                job=JOB,
                argv=[
                    sys.executable,
                    "-m",
                    "goodput.examples.gpt.supervised",
                    "--steps",
                    "100000",
                    "--log-every",
                    "0",
                ],
                nodes=2,
                procs_per_node=1,
                spares=1,
                env={"GOODPUT_CKPT_EVERY": "20"},
            ),
        )
        await tap.wait_for(
            lambda e: isinstance(e, schemas.StepDone) and e.step >= 20, timeout_s=120
        )
        goodput_cli(
            "chaos",
            "slow-rank",
            "--state-dir",
            str(state),
            "--job",
            JOB,
            "--rank",
            "1",
            "--factor",
            "2",
            "--duration",
            "90",
            "--detach",
        )
        signal = await tap.wait_for(
            lambda e: (
                isinstance(e, schemas.Signal) and e.signal == "straggler" and e.node == "node-1"
            ),
            timeout_s=90,
        )
        decision = await tap.wait_for(
            lambda e: isinstance(e, schemas.Decision) and e.signal_id == signal.signal_id
        )
        assert decision.rule == "evict-straggler-hot-swap"
        swapped = await tap.wait_for(
            lambda e: (
                isinstance(e, schemas.JobStatus)
                and e.state == "running"
                and e.attempt >= 2
                and "node-1" not in e.active_nodes
            )
        )
        assert swapped.world_size == 2
    finally:
        goodput_cli(
            "chaos",
            "slow-rank",
            "--state-dir",
            str(state),
            "--job",
            JOB,
            "--rank",
            "1",
            "--clear",
            check=False,
        )
        await bus.send_command(subjects.ACTUATOR, schemas.Stop(job=JOB, reason="test done"))
        await tap.stop()
        await bus.close()
        goodput_cli("down", "--state-dir", str(state), check=False)
