"""`goodput bench detect`: how fast the sensor notices each kind of fault, in one real job.

The example job runs under the real stack (2 nodes and a spare). In order: an unperturbed
stretch of ``--fp-steps`` steps during which any straggler signal is a false positive; one
rank slowed 1.5× by a SIGSTOP/SIGCONT duty cycle (steps until the straggler signal); a
kill -9 of a rank (seconds until the crash signal); a rank whose training loop hangs while
its heartbeats go on (seconds until the hang signal); a rank frozen whole (SIGSTOP: seconds
until the missed-heartbeat signal). Each fault is remediated before the next one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from goodput import schemas, subjects
from goodput.bench.recovery import WAIT_S
from goodput.bus import Bus
from goodput.bus.job_events import JobEvents
from goodput.chaos.straggler import duty_cycle
from goodput.config import add_bus_arguments
from goodput.rank_env import knobs
from goodput.stack.launcher import start_stack, stop_stack, wait_healthy

NS = 1e9
HEARTBEAT_TIMEOUT_S = 3.0
POLL_S = 0.5


def _running(log: JobEvents) -> schemas.JobStatus:
    return next(
        e for e in reversed(log.events) if isinstance(e, schemas.JobStatus) and e.state == "running"
    )


def _step(log: JobEvents) -> int:
    return next(
        (e.step for e in reversed(log.events) if isinstance(e, schemas.StepDone) and e.rank == 0),
        0,
    )


async def _after_resume(log: JobEvents, since_ts: int, steps: int = 15) -> None:
    """Wait until the job runs a new attempt and made ``steps`` steps in it."""
    restarted = await log.wait_for(
        lambda e: isinstance(e, schemas.JobStatus) and e.state == "running",
        WAIT_S,
        "the job running again",
        after_ts=since_ts,
    )
    first = await log.wait_for(
        lambda e: isinstance(e, schemas.StepDone) and e.rank == 0,
        WAIT_S,
        "the first step after resume",
        after_ts=restarted.ts,
    )
    await log.wait_for(
        lambda e: isinstance(e, schemas.StepDone) and e.rank == 0 and e.step >= first.step + steps,
        WAIT_S,
        f"{steps} steps after resume",
        after_ts=first.ts,
    )


async def _signal_after(log: JobEvents, kind: str, since_ts: int, timeout_s: float = 120.0):
    return await log.wait_for(
        lambda e: isinstance(e, schemas.Signal) and e.signal == kind,
        timeout_s,
        f"a {kind} signal",
        after_ts=since_ts,
    )


async def _measure(bus: Bus, log: JobEvents, job: str, fp_steps: int, console: Console) -> dict:
    result: dict = {}
    start_ts = schemas.now_ns()
    await bus.send_command(
        subjects.ACTUATOR,
        schemas.StartJob(
            job=job,
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
            spares=3,
            env=knobs(ckpt_every=25, enable_fault_injection=True),
        ),
    )
    with console.status(f"unperturbed run of {fp_steps} steps (false positives)…"):
        await log.wait_for(
            lambda e: isinstance(e, schemas.StepDone) and e.rank == 0 and e.step >= fp_steps,
            timeout_s=30 + fp_steps,
            what=f"step {fp_steps}",
            after_ts=start_ts,
        )
    result["straggler_false_positives"] = sum(
        isinstance(e, schemas.Signal) and e.signal == "straggler" for e in log.events
    )
    result["unperturbed_steps"] = fp_steps

    status = _running(log)
    victim = status.pids[status.active_nodes[1]][0]
    slowed_at_step, slowed_ts = _step(log), schemas.now_ns()
    with console.status("rank 1 slowed 1.5× …"):
        slowing = asyncio.create_task(duty_cycle(victim, 1.5, 120.0))
        try:
            found = await _signal_after(log, "straggler", slowed_ts)
        finally:
            slowing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await slowing
    result["straggler_detect_steps"] = _step_at(log, found.ts) - slowed_at_step
    result["straggler_node"] = found.node
    await _after_resume(log, found.ts)

    status = _running(log)
    victim = status.pids[status.active_nodes[0]][0]
    killed_ts = schemas.now_ns()
    os.kill(victim, signal.SIGKILL)
    found = await _signal_after(log, "crash", killed_ts)
    result["crash_detect_s"] = (found.ts - killed_ts) / NS
    await _after_resume(log, found.ts)

    status = _running(log)
    node = status.active_nodes[1]
    hang_ts = schemas.now_ns()
    await bus.send_command(
        subjects.TRAINER, schemas.InjectFault(job=job, node=node, fault="hang", detail="1")
    )
    with console.status("rank 1's training loop hangs (heartbeats go on)…"):
        found = await _signal_after(log, "hang", hang_ts)
    result["hang_detect_s"] = (found.ts - hang_ts) / NS
    await _after_resume(log, found.ts)

    status = _running(log)
    victim = status.pids[status.active_nodes[0]][0]
    frozen_ts = schemas.now_ns()
    os.kill(victim, signal.SIGSTOP)
    try:
        found = await _signal_after(log, "missed_heartbeat", frozen_ts)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGCONT)
    result["missed_heartbeat_detect_s"] = (found.ts - frozen_ts) / NS
    result["heartbeat_timeout_s"] = HEARTBEAT_TIMEOUT_S
    result["heartbeat_polling_period_s"] = POLL_S
    await bus.send_command(subjects.ACTUATOR, schemas.Stop(job=job, reason="benchmark done"))
    return result


def _step_at(log: JobEvents, ts: int) -> int:
    return max(
        (
            e.step
            for e in log.events
            if isinstance(e, schemas.StepDone) and e.rank == 0 and e.ts <= ts
        ),
        default=0,
    )


def run(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    flags = {
        "sensor": [
            "--set",
            f"thresholds={{heartbeat_timeout_s={HEARTBEAT_TIMEOUT_S},"
            f"heartbeat_polling_period_s={POLL_S}}}",
        ],
    }
    with tempfile.TemporaryDirectory(prefix="goodput-bench-detect-") as tmp:
        state_dir = Path(args.state_dir or tmp).resolve()
        try:
            stack, settings = start_stack(args, state_dir, "bench", 5, console, flags)
            asyncio.run(wait_healthy(settings, stack.job, stack.services, 30, console))
            result = asyncio.run(_run(settings, stack.job, args.fp_steps, console))
        finally:
            stop_stack(state_dir)
    result["targets"] = {
        "crash_detect_s": 1.0,
        "missed_heartbeat_detect_s": HEARTBEAT_TIMEOUT_S + POLL_S,
        "straggler_detect_steps": 20,
        "straggler_false_positives": 0,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    table = Table(title="fault → signal")
    table.add_column("figure")
    table.add_column("measured", justify="right")
    table.add_column("target", justify="right")
    for key, target in result["targets"].items():
        table.add_row(key, f"{result[key]:.3g}", f"≤ {target}")
    table.add_row("hang_detect_s", f"{result['hang_detect_s']:.3g}", "adaptive")
    Console().print(table)
    return 0


async def _run(settings, job: str, fp_steps: int, console: Console) -> dict:
    bus = await Bus.connect(settings, name="goodput-bench-detect")
    try:
        log = await JobEvents(bus, job).start()
        return await _measure(bus, log, job, fp_steps, console)
    finally:
        await bus.close()


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "detect",
        help="time from fault to signal: crash, hang, straggler, missed heartbeat",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--fp-steps", type=int, default=500, help="unperturbed steps (default 500)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--state-dir", help="keep the stack's state and logs here (default: temp)")
    add_bus_arguments(parser)
    parser.set_defaults(func=run)
