"""The phases of `goodput bench gpu`, what each needs, and what a phase's process prints.

One phase runs in a process of its own (:mod:`goodput.tools.bench.gpu_phase_process`), so that
a poisoned CUDA context or a killed process takes no other phase down. Its stdout carries JSON
lines only (:func:`emit`): ``{"partial": {...}}`` as figures come in (what a phase that runs
out of time still reports) and, last, ``{"figures": {...}}`` or ``{"failed": "<one line>"}``.
Progress goes to stderr (:func:`say`).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: the module a phase's process runs (``python -m``); the parent imports none of the phases
PROCESS_MODULE = "goodput.tools.bench.gpu_phase_process"

#: what a phase may need, checked before its process starts (NVML by the probe: phase D)
Need = str
CUDA: Need = "cuda"
NCCL: Need = "nccl"
NVML: Need = "nvml"


@dataclass(frozen=True)
class Phase:
    title: str
    #: seconds its process may run on an H200 before it is killed (the whole kit: 8 minutes)
    budget_s: float
    needs: tuple[Need, ...]


PHASES: dict[str, Phase] = {
    "A": Phase(
        "the shim's save, the engine's overlapped save and DCP's async staging at --size-gb;"
        " the first save's pinning; pinned memory around a restore",
        165,
        (CUDA,),
    ),
    "B": Phase("a one-rank NCCL group aborted and re-created 20 times", 45, (CUDA, NCCL)),
    "C": Phase(
        "a device-side assert, then abort and re-init: the rank goes cold", 45, (CUDA, NCCL)
    ),
    "D": Phase("a process killed mid-kernel: XIDs, and how long NVML lists it", 40, (CUDA, NVML)),
    "E": Phase("the per-step stop vote's cost (`bench shim --device cuda`)", 40, (CUDA,)),
    "F": Phase("a sharded (FSDP2) restore onto the GPU, against dcp.load", 35, (CUDA, NCCL)),
    "G": Phase("`bench ckpt --device cuda --saves 2` at 4 GB", 100, (CUDA,)),
}
#: the state phase A saves unless --size-gb says otherwise
SIZE_GB = 16.0


def say(text: str) -> None:
    """A progress line (the parent shows it as it comes)."""
    print(text, file=sys.stderr, flush=True)


def emit(kind: str, value: Any) -> None:
    print(json.dumps({kind: value}), flush=True)


def one_line(error: BaseException) -> str:
    """An error as one line: its type and its message's first line."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}".rstrip(": ")


def command(letter: str, work: Path, size_gb: float) -> list[str]:
    """The command line of phase ``letter``'s process."""
    return [
        sys.executable, "-m", PROCESS_MODULE, letter, "--work", str(work), "--size-gb", str(size_gb)
    ]  # fmt: skip
