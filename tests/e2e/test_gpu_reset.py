"""The GPU-reset rung on the real stack: `goodput chaos gpu-xid --xid 48` on a node whose host
monitor sees two FakeNvml GPUs and resets them with FakeNvidiaSmi; sensor, controller,
actuator, host monitors and (sleeping) ranks are the real processes."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from goodput import schemas
from tests.conftest import goodput_cli
from tests.stack.helpers import EventTap, job_on_stack

pytestmark = pytest.mark.slow
JOB = "job-gpu-reset"
SLEEPER = "import time; time.sleep(600)"
ROOT = Path(__file__).resolve().parents[2]
FAKE_NVIDIA_SMI = ROOT / "tests" / "hostmon" / "fake_nvidia_smi.py"


@pytest.fixture
def stack_with_fake_gpus(tmp_path: Path, monkeypatch):
    """A stack factory whose host monitors reset GPUs the way ``mode`` says."""

    @contextlib.asynccontextmanager
    async def start(mode: str) -> AsyncIterator[tuple[Path, EventTap]]:
        # a hang is cut at 3 s; a reset that answers gets time even on a loaded machine
        timeout_s = 3 if mode == "hang" else 60
        monkeypatch.setenv("GOODPUT_FAKE_NVIDIA_SMI", mode)
        monkeypatch.setenv(
            "PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        )
        state = tmp_path / "stack"
        start = schemas.StartJob(
            job=JOB, argv=[sys.executable, "-c", SLEEPER], nodes=2, procs_per_node=1, spares=1
        )
        async with job_on_stack(
            state,
            JOB,
            3,
            start,
            *("--service-set", "hostmon:enable_fault_injection=true"),
            *("--service-set", "hostmon:nvml_module=tests.hostmon.fake_gpu_node:nvml"),
            *("--service-set", f"hostmon:nvidia_smi='{FAKE_NVIDIA_SMI}'"),
            *("--service-set", f"hostmon:gpu_reset_timeout_s={timeout_s}"),
        ) as (_, tap):
            await tap.wait_for(lambda e: isinstance(e, schemas.JobStatus) and e.state == "running")
            yield state, tap

    return start


async def _inject_xid_48(state: Path, tap: EventTap) -> schemas.Decision:
    goodput_cli(
        "chaos", "gpu-xid", "--xid", "48", "--state-dir", str(state), "--job", JOB,
        "--node", "node-1",
    )  # fmt: skip
    signal = await tap.wait_for(
        lambda e: isinstance(e, schemas.Signal) and e.signal == "degraded_host",
        what="degraded_host signal",
    )
    assert signal.node == "node-1" and signal.host_faults == ["gpu_xid:48"]
    decision = await tap.wait_for(
        lambda e: isinstance(e, schemas.Decision) and e.signal_id == signal.signal_id
    )
    assert decision.rule == "gpu-reset", decision.reason
    return decision


async def test_a_reset_correctable_xid_is_reset_and_the_job_resumes_on_its_nodes(
    stack_with_fake_gpus,
) -> None:
    async with stack_with_fake_gpus("ok") as (state, tap):
        await _inject_xid_48(state, tap)
        reset = await tap.wait_for(lambda e: isinstance(e, schemas.GpuReset), what="GpuReset")
        assert (reset.node, reset.outcome, reset.gpus, reset.attempt) == (
            "node-1",
            "succeeded",
            [0, 1],
            1,
        )
        resumed = await tap.wait_for(
            lambda e: isinstance(e, schemas.JobStatus) and e.attempt == 2 and e.state == "running"
        )
        assert resumed.active_nodes == ["node-0", "node-1"] and resumed.spare_nodes == ["node-2"]
        healthy = await tap.wait_for(
            lambda e: isinstance(e, schemas.Decision) and e.rule == "node-healthy",
            what="the node's return after the reset",
        )
        assert "node-1 is healthy again" in healthy.reason


@pytest.mark.parametrize(("mode", "outcome"), [("fail", "failed"), ("hang", "timed_out")])
async def test_a_reset_that_fails_or_times_out_goes_to_the_next_rung(
    stack_with_fake_gpus, mode: str, outcome: str
) -> None:
    async with stack_with_fake_gpus(mode) as (state, tap):
        await _inject_xid_48(state, tap)
        reset = await tap.wait_for(lambda e: isinstance(e, schemas.GpuReset), what="GpuReset")
        assert reset.outcome == outcome and reset.node == "node-1"
        refused = await tap.wait_for(
            lambda e: isinstance(e, schemas.ActionResult) and e.action == "restart"
        )
        assert not refused.ok and "GPU reset failed, ranks not relaunched" in refused.detail
        next_rung = await tap.wait_for(
            lambda e: isinstance(e, schemas.Decision) and e.rule == "hot-swap",
            what="the hot swap after the failed reset",
        )
        assert "GPU reset failed" in next_rung.reason
        swapped = await tap.wait_for(
            lambda e: isinstance(e, schemas.JobStatus) and e.attempt == 2 and e.state == "running"
        )
        assert swapped.active_nodes == ["node-0", "node-2"] and "node-1" in swapped.failed_nodes
