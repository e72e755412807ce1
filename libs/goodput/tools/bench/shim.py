"""`goodput bench shim`: what the trainer shim costs each step, against the same loop without it.

``--ranks`` rank processes (one group) each train the same MLP and run every mode of
:mod:`goodput.tools.bench.shim_loop` for ``--steps`` steps, ``--repeats`` times, the modes
interleaved so that the machine's load falls on all of them alike. A mode's overhead is its
block's time less the plain loop's block of the same repeat, per step, in milliseconds, and
as a fraction of a 1 s step (the goal: at most 1 %). Figures are ranges over the repeats.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from goodput.bus.embedded import free_port
from goodput.tools.bench.arguments import device as device_arg
from goodput.tools.bench.arguments import positive_int
from goodput.tools.bench.shim_loop import MODES, LoopSpec, command, numerics_every

_console = Console(stderr=True)
#: how long the other ranks may take to exit once rank 0 has reported
EXIT_TIMEOUT_S = 120.0


def _ranges(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def summarize(spec: LoopSpec, seconds: dict[str, list[float]]) -> dict[str, Any]:
    """Per mode: step time, and overhead against ``plain`` of the same repeat (ms per step,
    fraction of a 1 s step), as min / median / max over the repeats."""
    plain = seconds["plain"]
    modes: dict[str, Any] = {}
    for name in MODES:
        step_ms = [s / spec.steps * 1e3 for s in seconds[name]]
        overhead_ms = [
            (s - p) / spec.steps * 1e3 for s, p in zip(seconds[name], plain, strict=True)
        ]
        modes[name] = {
            "step_ms": _ranges(step_ms),
            "overhead_ms": _ranges(overhead_ms),
            "fraction_of_1s_step": _ranges([ms / 1e3 for ms in overhead_ms]),
        }
    return modes


def run_benchmark(spec: LoopSpec) -> dict[str, Any]:
    ranks = [
        subprocess.Popen(
            command(rank, spec),
            stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL,
            text=True,
        )
        for rank in range(spec.world)
    ]
    result: dict[str, Any] | None = None
    try:
        with _console.status(f"{spec.world} ranks: warming up every mode…") as status:
            assert ranks[0].stdout is not None
            for line in ranks[0].stdout:  # ends when rank 0 exits
                kind, value = json.loads(line)
                if kind == "progress":
                    status.update(f"repeat {value}/{spec.repeats} done")
                else:
                    result = value
        codes = [process.wait(EXIT_TIMEOUT_S) for process in ranks]
    finally:
        for process in ranks:
            if process.poll() is None:
                process.kill()
                process.wait()
    if result is None or any(codes):
        raise RuntimeError(f"a rank failed (exit codes {codes})")
    return {
        "device": spec.device,
        "device_name": torch.cuda.get_device_name(spec.device)
        if spec.device.startswith("cuda")
        else "cpu",
        "ranks": spec.world,
        "steps_per_block": spec.steps,
        "repeats": spec.repeats,
        "model": {"width": spec.width, "depth": spec.depth, "batch": spec.batch},
        "state_bytes": result["state_bytes"],
        "modes": summarize(spec, result["seconds"]),
        "votes": {
            name: {"launched": launched, "waited": waited}
            for name, (launched, waited) in result["votes"].items()
        },
        "fingerprints_agreed": result["fingerprints_agreed"],
        "notes": {
            "overhead_ms": "(mode's block − plain's block of the same repeat) / steps, rank 0,"
            " device-synced at both ends of a block",
            "shim_save": "one overlapped save per block (shim.guard(optimizer))",
            "shim_save_blocking": "one save per block, its copy inside the call",
            "vote_blocking": "the shim with the stop voted by a blocking all-reduce every step",
            "shim_numerics": "the shim with each step's loss and gradient norm given to the"
            f" numerics monitor, a window read every {numerics_every(spec.steps)} steps, the"
            f" replicas' parameters fingerprinted and compared every {spec.steps} steps",
            "votes": "ballots the pipelined vote launched, and those whose answer was not in yet"
            " when read (the host waited)",
            "fingerprints_agreed": "shim_numerics: comparisons of the replicas' fingerprints"
            " that found them equal, rank 0, warm-up block included",
            "bus": "no bus: the step report is queued for no link",
        },
    }


def _print_table(report: dict[str, Any]) -> None:
    table = Table(
        title=f"shim per-step overhead ({report['ranks']} ranks, {report['device_name']},"
        f" {report['steps_per_block']} steps × {report['repeats']} repeats; min–max)"
    )
    for column in ("mode", "step ms", "overhead ms", "of a 1 s step"):
        table.add_column(column, justify="left" if column == "mode" else "right")
    for name, mode in report["modes"].items():
        step, over, frac = mode["step_ms"], mode["overhead_ms"], mode["fraction_of_1s_step"]
        table.add_row(
            name,
            f"{step['min']:.2f}–{step['max']:.2f}",
            f"{over['min']:+.3f}–{over['max']:+.3f}",
            f"{frac['min']:+.3%}–{frac['max']:+.3%}",
        )
    Console().print(table)


def run(args: argparse.Namespace) -> int:
    spec = LoopSpec(
        device=args.device,
        width=args.width,
        depth=args.depth,
        batch=args.batch,
        steps=args.steps,
        repeats=args.repeats,
        world=args.ranks,
        port=free_port(),
    )
    report = run_benchmark(spec)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_table(report)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "shim",
        help="the trainer shim's per-step overhead against the same loop without goodput",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--ranks", type=positive_int, default=2, help="rank processes (one group)")
    parser.add_argument("--steps", type=positive_int, default=20, help="steps per timed block")
    parser.add_argument("--repeats", type=positive_int, default=3, help="blocks per mode")
    parser.add_argument("--width", type=positive_int, default=512, help="MLP width")
    parser.add_argument("--depth", type=positive_int, default=4, help="MLP layers")
    parser.add_argument("--batch", type=positive_int, default=64, help="rows per step")
    parser.add_argument(
        "--device", type=device_arg, default="cpu", help="cpu, or cuda (every rank on that GPU)"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run)
