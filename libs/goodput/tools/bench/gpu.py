"""`goodput bench gpu`: the GPU kit's benchmark (issue 38), phases A-G, each in a process.

Each phase runs in a process of its own (a poisoned CUDA context, C, or a killed process, D,
takes no other phase down) within a time budget; the whole kit stays within 8 minutes on an
NVIDIA H200. It never resets a GPU and never touches MIG. Progress lines go to stderr; the
report (the card's name, NVML's driver version, torch's version, each phase's figures or
``{"refused": "<why>"}`` or ``{"failed": "<why>"}``, and the total wall time) to stdout,
and to --out as bench-gpu.json, rewritten after each phase.

Where a phase's needs are missing (no CUDA device; no NCCL; no NVML for D) it is refused
with the reason and nothing of it runs: on a machine without a GPU every phase is refused
(the kit's "dry" form). Exit status: 0 when every phase that ran measured (refusals beside
them allowed), 1 when a phase failed or ran out of its budget, 3 when nothing was measured
(every phase refused).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from goodput.tools.bench.gpu_phases import CUDA, NCCL, NVML, PHASES, SIZE_GB, command

#: the exit status that says nothing was measured (every phase refused)
NOTHING_MEASURED = 3


def phases_arg(text: str) -> list[str]:
    """``A,B,...``: phases of :data:`PHASES`, refused in one line otherwise."""
    letters = [part.strip().upper() for part in text.split(",") if part.strip()]
    unknown = sorted(set(letters) - set(PHASES))
    if unknown or not letters:
        raise argparse.ArgumentTypeError(
            f"unknown phase {', '.join(unknown) or repr(text)}: the phases are {', '.join(PHASES)}"
        )
    return sorted(set(letters))


def missing(needs: tuple[str, ...]) -> list[str]:
    """What of ``needs`` this machine lacks, each in words naming it."""
    import torch
    import torch.distributed as dist

    gaps = []
    if CUDA in needs and not torch.cuda.is_available():
        gaps.append(f"no CUDA device (torch {torch.__version__}, CUDA {torch.version.cuda})")
    if NCCL in needs and not (dist.is_available() and dist.is_nccl_available()):
        gaps.append(f"no NCCL in torch {torch.__version__}")
    if NVML in needs:
        from goodput.tools.bench.gpu_kill import nvml_missing

        if why := nvml_missing():
            gaps.append(f"no NVML: {why}")
    return gaps


def run_phase(letter: str, work: Path, size_gb: float) -> dict[str, Any]:
    """One phase in its own session (killed, victims and ranks too, past its budget)."""
    budget = PHASES[letter].budget_s
    process = subprocess.Popen(
        command(letter, work, size_gb), stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, _ = process.communicate(timeout=budget)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        out, _ = process.communicate()
        return _outcome(out, f"ran past its budget of {budget:g} s")
    finally:
        _end_group(process.pid)
    return _outcome(out, f"its process exited {process.returncode} with no report")


def _end_group(pid: int) -> None:
    """What a phase left running (a rank, a victim) goes with it."""
    with contextlib.suppress(ProcessLookupError):  # nothing was left
        os.killpg(pid, signal.SIGKILL)


def _outcome(out: str, otherwise: str) -> dict[str, Any]:
    """The phase's last word: its figures, its failure, or ``otherwise`` with its partial."""
    partial: Any = None
    for line in out.splitlines():
        try:
            message = json.loads(line)
        except ValueError:
            continue  # a library's print: not the phase's
        if not isinstance(message, dict):
            continue
        if "figures" in message or "failed" in message:
            return {**message, **({"partial": partial} if "failed" in message and partial else {})}
        partial = message.get("partial", partial)
    return {"failed": otherwise, **({"partial": partial} if partial else {})}


def card() -> dict[str, Any]:
    import torch

    from goodput.tools.bench.gpu_kill import driver_version

    cuda = torch.cuda.is_available()
    return {
        "name": torch.cuda.get_device_name(0) if cuda else None,
        "driver": driver_version() if cuda else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }


def run_kit(
    letters: list[str], size_gb: float, work: Path, keep: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """Every phase of ``letters`` in turn; ``keep`` gets the report after each (a run cut
    short, a lease ending, still leaves the phases done)."""
    started = time.perf_counter()
    report: dict[str, Any] = {
        "card": card(),
        "size_gb": size_gb,
        "phases": {},
        "budgets_s": {letter: PHASES[letter].budget_s for letter in letters},
        "wall_s": 0.0,
    }
    phases = report["phases"]
    for letter in letters:
        phase = PHASES[letter]
        if gaps := missing(phase.needs):
            phases[letter] = {"refused": "; ".join(gaps)}
            print(f"bench gpu {letter}: refused: {phases[letter]['refused']}", file=sys.stderr)
        else:
            print(f"bench gpu {letter}: {phase.title} (≤ {phase.budget_s:g} s)", file=sys.stderr)
            phase_work = work / letter
            phase_work.mkdir(parents=True, exist_ok=True)
            begun = time.perf_counter()
            phases[letter] = run_phase(letter, phase_work, size_gb)
            phases[letter]["wall_s"] = time.perf_counter() - begun
            what = "failed: " + phases[letter]["failed"] if "failed" in phases[letter] else "done"
            print(f"bench gpu {letter}: {what} ({phases[letter]['wall_s']:.0f} s)", file=sys.stderr)
        report["wall_s"] = time.perf_counter() - started
        keep(report)
    return report


def exit_status(report: dict[str, Any]) -> int:
    outcomes = report["phases"].values()
    if any("failed" in outcome for outcome in outcomes):
        return 1
    if all("refused" in outcome for outcome in outcomes):
        return NOTHING_MEASURED
    return 0


def run(args: argparse.Namespace) -> int:
    out = Path(args.out) / "bench-gpu.json" if args.out else None
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)

    def keep(report: dict[str, Any]) -> None:
        if out is not None:
            out.write_text(json.dumps(report, indent=2) + "\n")

    if args.dir:
        Path(args.dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="goodput-bench-gpu-", dir=args.dir) as work:
        report = run_kit(args.phases, args.size_gb, Path(work), keep)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for letter, outcome in report["phases"].items():
            word = next(k for k in ("refused", "failed", "figures") if k in outcome)
            detail = outcome[word] if word != "figures" else "measured (--json for the figures)"
            print(f"{letter} {PHASES[letter].title}: {word}: {detail}")
    return exit_status(report)


def register(subparsers: argparse._SubParsersAction) -> None:
    budgets = "; ".join(f"{k} ≤ {p.budget_s:g} s: {p.title}" for k, p in PHASES.items())
    parser = subparsers.add_parser(
        "gpu",
        help="the GPU kit's benchmark, phases A-G, each in its own process (refused without a GPU)",
        description=f"{__doc__}\nPhases and their budgets: {budgets}.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--phases",
        type=phases_arg,
        default=sorted(PHASES),
        help="comma-separated phases to run (default: all, A-G)",
    )
    parser.add_argument(
        "--size-gb", type=float, default=SIZE_GB, help=f"phase A's state (default {SIZE_GB:g})"
    )
    parser.add_argument(
        "--dir", help="where the phases write their checkpoints (default: the system temp dir)"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--out", help="also write the report to DIR/bench-gpu.json, rewritten after each phase"
    )
    parser.set_defaults(func=run)
