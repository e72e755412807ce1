"""The phases of `goodput bench gpu`, what each needs, and the process one phase runs in.

``python -m goodput.tools.bench.gpu_phases LETTER --work DIR --size-gb N`` runs one phase
(started by :mod:`goodput.tools.bench.gpu`, one process per phase, so that a poisoned CUDA
context or a killed process takes no other phase down). Its stdout carries JSON lines only:
``{"partial": {...}}`` as figures come in (what a phase that runs out of time still reports)
and, last, ``{"figures": {...}}`` or ``{"failed": "<one line>"}``. Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def _runner(letter: str) -> Callable[[argparse.Namespace], dict[str, Any]]:
    if letter in "AFG":
        from goodput.tools.bench import gpu_ckpt

        return {"A": gpu_ckpt.phase_a, "F": gpu_ckpt.phase_f, "G": gpu_ckpt.phase_g}[letter]
    if letter == "D":
        from goodput.tools.bench import gpu_kill

        return gpu_kill.phase_d
    from goodput.tools.bench import gpu_groups

    return {"B": gpu_groups.phase_b, "C": gpu_groups.phase_c, "E": gpu_groups.phase_e}[letter]


def command(letter: str, work: Path, size_gb: float) -> list[str]:
    return [
        sys.executable, "-m", __name__, letter, "--work", str(work), "--size-gb", str(size_gb)
    ]  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=f"python -m {__name__}")
    parser.add_argument("phase", choices=sorted(PHASES))
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--size-gb", type=float, default=SIZE_GB)
    args = parser.parse_args(argv)
    try:
        figures = _runner(args.phase)(args)
    except Exception as error:  # the parent reports it in one line; the trace goes to stderr
        import traceback

        traceback.print_exc()
        emit("failed", one_line(error))
        sys.stdout.flush()
        os._exit(1)
    emit("figures", figures)
    sys.stdout.flush()
    sys.stderr.flush()
    # no interpreter finalization: a phase's NCCL communicators and CUDA context are the
    # driver's to tear down, and a poisoned context (C) can hang a destructor
    os._exit(0)


if __name__ == "__main__":
    main()
