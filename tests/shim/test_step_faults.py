"""A failed step read for what it means to the process (``goodput.shim.step_faults``), and the
shim's loop acting on it: a sticky CUDA error leaves cold at once, an OOM is retried warm once.

The CUDA context is tests/shim/fake_cuda.py's FakeCudaContext (a named fake: a GPU cannot run
here); the loop, the group (gloo), the bus and the checkpoint engine are real."""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from goodput import schemas, subjects
from goodput.bus import Bus
from goodput.launch.rank_env import EXIT_CODES
from goodput.shim.step_faults import OomRetry, classify
from tests.processes import kill_async
from tests.shim.fake_cuda import ILLEGAL_ADDRESS, FakeCudaContext

REPO = Path(__file__).resolve().parents[2]


def _raised(call) -> BaseException:
    try:
        call()
    except BaseException as exc:  # the test reads what was raised
        return exc
    raise AssertionError("nothing was raised")


def test_a_sticky_error_poisons_the_fake_context_for_every_later_call() -> None:
    cuda = FakeCudaContext(1 << 30)
    first = _raised(lambda: cuda.fail_sticky(ILLEGAL_ADDRESS))
    later = _raised(cuda.call)
    assert isinstance(later, torch.AcceleratorError) and later.error_code == 700
    assert str(later) == str(first) and cuda.poisoned
    assert classify(first).kind == classify(later).kind == "context"


def test_sticky_errors_go_cold_whatever_wraps_them() -> None:
    cuda = FakeCudaContext(1 << 30)
    poisoned = classify(_raised(cuda.fail_sticky))
    assert poisoned.kind == "context" and poisoned.rank_fault == "cuda-context"
    assert "device-side assert triggered (cudaError 710" in poisoned.reason
    # the message alone (a cuBLAS call, an extension, an older torch): same verdict
    assert classify(RuntimeError("CUDA error: uncorrectable ECC error encountered")).kind == (
        "context"
    )
    # an NCCL error caused by one, as ProcessGroupNCCL reports it
    nccl = dist.DistBackendError(
        "NCCL error in: ProcessGroupNCCL.cpp:3356, unhandled cuda error, NCCL version 2.27.5\n"
        "Last error:\nCuda failure 'an illegal memory access was encountered'"
    )
    assert classify(nccl).kind == "context"
    # raised while handling one: the chain is read
    try:
        try:
            cuda.call()
        except torch.AcceleratorError as exc:
            raise RuntimeError("the step failed") from exc
    except RuntimeError as wrapped:
        assert classify(wrapped).kind == "context"


def test_an_oom_and_everything_else() -> None:
    oom = classify(_raised(lambda: FakeCudaContext(1 << 30).allocate(2 << 30)))
    assert oom.kind == "oom" and oom.rank_fault == "cuda-oom"
    assert oom.reason.startswith("out of GPU memory: CUDA out of memory. Tried to allocate 2.00")
    assert classify(RuntimeError("CUBLAS_STATUS_ALLOC_FAILED when calling cublasCreate")).kind == (
        "oom"
    )
    # a non-sticky CUDA error, a peer's death, an aborted communicator: the warm path
    invalid = torch.AcceleratorError("CUDA error: invalid argument")
    invalid.error_code = 1  # type: ignore[attr-defined]
    for error in (
        invalid,
        dist.DistBackendError("NCCL communicator was aborted on rank 1"),
        RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed"),
        ValueError("a bug in the script"),
    ):
        fault = classify(error)
        assert fault.kind == "recoverable" and fault.rank_fault == "", error


def test_an_oom_is_retried_once_until_the_step_that_failed_is_passed() -> None:
    retry = OomRetry()
    assert retry.allows(2)  # the first OOM, with 2 steps done
    assert not retry.allows(2)  # restored and ran out at the same place: deterministic
    assert not retry.allows(1)  # restored further back, out before passing it again
    assert retry.allows(7)  # passed it: a new OOM, its own retry


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Rank:
    """tests/shim/cuda_fault_rank.py as a process, its log read line by line."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.lines: list[str] = []

    @classmethod
    async def start(cls, bus: Bus, root: Path, scenario: str) -> Rank:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.shim.cuda_fault_rank",
            bus.settings.url,
            str(root),
            str(_free_port()),
            scenario,
            cwd=REPO,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        return cls(process)

    async def wait_for(self, words: str, timeout_s: float = 120) -> None:
        async def read() -> None:
            assert self.process.stdout is not None
            while not any(words in line for line in self.lines):
                line = await self.process.stdout.readline()
                if not line:
                    raise AssertionError(f"exited before {words!r}: {self.lines[-20:]}")
                self.lines.append(line.decode(errors="replace").rstrip())

        await asyncio.wait_for(read(), timeout_s)

    async def exit_code(self, timeout_s: float = 120) -> int:
        assert self.process.stdout is not None
        rest = await asyncio.wait_for(self.process.stdout.read(), timeout_s)
        self.lines += rest.decode(errors="replace").splitlines()
        return await self.process.wait()

    async def kill(self) -> None:
        await kill_async(self.process)


async def _rejoin(bus: Bus) -> None:
    rejoin = schemas.Rejoin(
        job="cuda", attempt=2, master_addr="127.0.0.1", master_port=_free_port(), world_size=1
    )
    await bus.send_command(subjects.TRAINER, rejoin)


async def _retried_warm(bus: Bus, root: Path, scenario: str) -> tuple[int, Rank]:
    """The rank of ``scenario`` taken through its warm retry (rejoined to attempt 2 once it
    says it retries) to its exit: its exit status, and the rank with its log."""
    rank = await Rank.start(bus, root, scenario)
    try:
        await rank.wait_for("retrying once, warm")
        await _rejoin(bus)
        return await rank.exit_code(), rank
    finally:
        await rank.kill()


@pytest.mark.timeout(300)
async def test_a_sticky_error_leaves_cold_at_once_with_its_reason(bus: Bus, tmp_path: Path) -> None:
    rank = await Rank.start(bus, tmp_path, "assert")
    try:
        code = await rank.exit_code()
    finally:
        await rank.kill()
    assert code == EXIT_CODES["cuda-context"], rank.lines[-20:]
    log = "\n".join(rank.lines)
    assert "leaving for a cold restart: its CUDA context cannot continue" in rank.lines[-1]
    assert "device-side assert triggered" in rank.lines[-1]
    # it never took the warm path: no group left, no Rejoin awaited (the 60 s wait)
    assert "training step abandoned" not in log and "Traceback" not in log


@pytest.mark.timeout(300)
async def test_an_oom_is_retried_warm_once_then_leaves_cold(bus: Bus, tmp_path: Path) -> None:
    code, rank = await _retried_warm(bus, tmp_path, "oom")
    assert code == EXIT_CODES["cuda-oom"], rank.lines[-20:]
    log = "\n".join(rank.lines)
    assert log.count("retrying once, warm") == 1 and "rejoined attempt 2" in log
    assert "leaving for a cold restart: out of GPU memory" in rank.lines[-1]


@pytest.mark.timeout(300)
async def test_an_oom_the_retry_cures_trains_on(bus: Bus, tmp_path: Path) -> None:
    code, rank = await _retried_warm(bus, tmp_path, "transient-oom")
    assert code == 0, rank.lines[-20:]
    assert "finished at step 6 after 1 restart(s)" in "\n".join(rank.lines)
