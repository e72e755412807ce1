"""One phase of `goodput bench gpu`, in the process it runs in.

``python -m goodput.tools.bench.gpu_phase_process LETTER --work DIR --size-gb N`` (started by
:mod:`goodput.tools.bench.gpu`, one process per phase): runs the phase and prints its JSON
lines (:mod:`goodput.tools.bench.gpu_phases`), then leaves without interpreter finalization.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from goodput.tools.bench import gpu_ckpt, gpu_groups, gpu_kill
from goodput.tools.bench.gpu_phases import PHASES, SIZE_GB, emit, one_line


def _runner(letter: str) -> Callable[[argparse.Namespace], dict[str, Any]]:
    if letter in "AFG":
        return {"A": gpu_ckpt.phase_a, "F": gpu_ckpt.phase_f, "G": gpu_ckpt.phase_g}[letter]
    if letter == "D":
        return gpu_kill.phase_d
    return {"B": gpu_groups.phase_b, "C": gpu_groups.phase_c, "E": gpu_groups.phase_e}[letter]


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
