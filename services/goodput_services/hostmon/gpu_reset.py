"""Resetting GPUs through ``nvidia-smi --gpu-reset``, under a deadline.

NVML's Python binding (nvidia-ml-py 13.x) has no GPU reset call — its ``nvmlDeviceReset*``
functions reset clocks and counters, not the GPU — so the host monitor runs
``nvidia-smi --gpu-reset -i <index>`` for each GPU, one after the other, in a process group
of its own that is killed when the deadline passes (a reset of a wedged GPU can block in the
driver). A reset needs every process off the GPU: the host monitor asks NVML which processes
still run compute work on each GPU first and refuses, naming them (:func:`held_refusal`);
nvidia-smi's own refusal of a GPU in use stays the last check.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from dataclasses import dataclass
from typing import Literal

from goodput_services.hostmon.gpu import GKE_NVIDIA_SMI

Outcome = Literal["succeeded", "failed", "timed_out"]
#: how much of nvidia-smi's output a result carries
OUTPUT_CHARS = 300


@dataclass
class ResetResult:
    outcome: Outcome
    detail: str
    duration_s: float


async def reset_gpus(nvidia_smi: str, indexes: list[int], timeout_s: float) -> ResetResult:
    """Reset each GPU in ``indexes`` in turn; the first failure ends it, as does the deadline."""
    start = time.monotonic()
    deadline = start + timeout_s
    done: list[str] = []
    for index in indexes:
        argv = [nvidia_smi, "--gpu-reset", "-i", str(index)]
        try:
            process = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            detail = f"cannot run {nvidia_smi} (option nvidia_smi; on GKE {GKE_NVIDIA_SMI}): {exc}"
            return ResetResult("failed", detail, _since(start))
        try:
            output, _ = await asyncio.wait_for(
                process.communicate(), max(deadline - time.monotonic(), 0.0)
            )
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
            return ResetResult(
                "timed_out",
                f"GPU {index}: {' '.join(argv)} still running after {timeout_s:g} s; killed",
                _since(start),
            )
        text = output.decode(errors="replace").strip()[-OUTPUT_CHARS:]
        if process.returncode != 0:
            return ResetResult(
                "failed",
                f"GPU {index}: {' '.join(argv)} exited {process.returncode}: {text or 'no output'}",
                _since(start),
            )
        done.append(str(index))
    return ResetResult("succeeded", f"GPU(s) {', '.join(done)} reset", _since(start))


def held_refusal(holders: dict[int, list[int] | None], names: dict[int, str]) -> str:
    """Why the reset must wait ("" when it need not): each GPU NVML sees a process on, with the
    pids (and their names, where this host can read them)."""
    held = []
    for index, pids in sorted(holders.items()):
        if pids:
            who = ", ".join(f"pid {pid} ({names[pid]})" if pid in names else f"pid {pid}"
                            for pid in pids)  # fmt: skip
            held.append(f"GPU {index} is still held by {who}")
    return "; ".join(held)


def _since(start: float) -> float:
    return time.monotonic() - start
