"""`goodput bench recovery`: from a rank's death to the first step after resume, broken down.

The example job runs under the real stack on local nodes; the benchmark kills one rank with
SIGKILL (a crash), reads the job's events and splits the time until training made its next
step into: detect (death → signal), decide (signal → decision), restart (decision → ranks
running and starting to load), load (checkpoint restore) and first step (load → first step
done). It repeats that ``--trials`` times in one job and reports the median of each part.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from goodput import schemas, subjects
from goodput.bus import Bus
from goodput.bus.job_events import JobEvents
from goodput.config import add_bus_arguments
from goodput.rank_env import knobs
from goodput.stack.launcher import start_stack, stop_stack, wait_healthy

NS = 1e9
PARTS = ("detect_s", "decide_s", "restart_s", "load_s", "first_step_s")
#: how long each awaited event may take before the job counts as not recovering
WAIT_S = 120.0


async def _trial(log: JobEvents, victim_node: str, min_step: int) -> dict:
    # wait for a checkpoint beyond min_step so the restore has something to load
    persisted = await log.wait_for(
        lambda e: isinstance(e, schemas.CheckpointPersisted) and e.step >= min_step,
        timeout_s=WAIT_S,
        what=f"a checkpoint at step {min_step} or later",
    )
    status = next(
        e for e in reversed(log.events) if isinstance(e, schemas.JobStatus) and e.state == "running"
    )
    pid = status.pids[victim_node][0]
    killed_ts = schemas.now_ns()
    os.kill(pid, signal.SIGKILL)
    sig = await log.wait_for(
        lambda e: isinstance(e, schemas.Signal), WAIT_S, "the crash signal", after_ts=killed_ts
    )
    decision = await log.wait_for(
        lambda e: isinstance(e, schemas.Decision) and e.signal_id == sig.signal_id,
        WAIT_S,
        "the decision",
        after_ts=killed_ts,
    )
    restored = await log.wait_for(
        lambda e: isinstance(e, schemas.CheckpointRestored) and e.rank == 0,
        WAIT_S,
        "the restore after the restart",
        after_ts=decision.ts,
    )
    first = await log.wait_for(
        lambda e: isinstance(e, schemas.StepDone) and e.rank == 0 and e.step == restored.step + 1,
        WAIT_S,
        "the first step after resume",
        after_ts=restored.ts,
    )
    load_started = restored.ts - int(restored.duration_s * NS)
    return {
        "killed_step_min": persisted.step,
        "restored_step": restored.step,
        "detect_s": (sig.ts - killed_ts) / NS,
        "decide_s": (decision.ts - sig.ts) / NS,
        "restart_s": max(load_started - decision.ts, 0) / NS,
        "load_s": restored.duration_s,
        "first_step_s": (first.ts - restored.ts) / NS,
        "total_s": (first.ts - killed_ts) / NS,
        "rule": decision.rule,
    }


async def _measure(settings, job: str, trials: int, steps: int, console: Console) -> list[dict]:
    bus = await Bus.connect(settings, name="goodput-bench-recovery")
    log = await JobEvents(bus, job).start()
    results = []
    try:
        start = schemas.StartJob(
            job=job,
            argv=[
                sys.executable,
                "-m",
                "goodput.examples.gpt.supervised",
                "--steps",
                str(steps),
                "--log-every",
                "0",
            ],
            nodes=2,
            procs_per_node=1,
            spares=1,
            env=knobs(ckpt_every=10),
        )
        await bus.send_command(subjects.ACTUATOR, start)
        for trial in range(trials):
            min_step = 20 * (trial + 1)
            with console.status(
                f"trial {trial + 1}/{trials}: waiting for step {min_step}, then kill -9…"
            ):
                result = await _trial(log, "node-1", min_step)
            console.print(f"trial {trial + 1}: {result['total_s']:.2f} s ({result['rule']})")
            results.append(result)
        await bus.send_command(subjects.ACTUATOR, schemas.Stop(job=job, reason="benchmark done"))
    finally:
        await bus.close()
    return results


def run(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    with tempfile.TemporaryDirectory(prefix="goodput-bench-recovery-") as tmp:
        state_dir = Path(tmp)
        try:
            stack, settings = start_stack(args, state_dir, "bench", 3, console)
            asyncio.run(wait_healthy(settings, stack.job, stack.services, 30, console))
            trials = asyncio.run(_measure(settings, stack.job, args.trials, args.steps, console))
        finally:
            stop_stack(state_dir)
    result = {
        "trials": trials,
        "total_s": round(statistics.median(t["total_s"] for t in trials), 3),
        **{part: round(statistics.median(t[part] for t in trials), 3) for part in PARTS},
        "target_total_s": 10.0,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    table = Table(title=f"recovery from kill -9 of a rank (median of {len(trials)})")
    table.add_column("part")
    table.add_column("seconds", justify="right")
    for part in (*PARTS, "total_s"):
        table.add_row(part.removesuffix("_s"), f"{result[part]:.2f}")
    Console().print(table)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "recovery",
        help="time from a rank's death to the first step after resume, by phase",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--trials", type=int, default=3, help="kills in one job (default 3)")
    parser.add_argument(
        "--steps", type=int, default=2000, help="job length; it is stopped after the trials"
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    add_bus_arguments(parser)
    parser.set_defaults(func=run)
