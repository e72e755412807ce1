"""One demo run: the stack, the example job, the scenario's faults, then the goodput report.

Two setups run the same scenario. ``goodput``: the built-in remediation policy, spares, and
asynchronous multi-tier checkpoints with Young's adaptive interval. ``baseline``: what a job
without goodput does — rank 0 ``torch.save``s synchronously into storage every node shares,
every fault restarts the whole job on the same nodes (``goodput.supervisor.policy.scripts.restart_whole_job``),
no spare, no change of size, a fixed checkpoint interval. Both use the same detection, so the
difference is what happens after a fault is seen, and what checkpoints cost, but for one
check a job without goodput does not make: its replicas' fingerprints. The baseline compares
none, so an SDC goes unseen and it trains on with the corrupted replica (rank 0's
``torch.save`` carries a flip of its replica into every later checkpoint and, at the next
whole-job restart, into both).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from rich.console import Console

from goodput import schemas, subjects
from goodput.bus import Bus, BusSettings
from goodput.examples.gpt import supervised_argv
from goodput.launch.rank_env import knobs
from goodput.measure.accounting import GoodputReport, compute_goodput, replay_from_bus
from goodput.state_dir import StateDir
from goodput.supervisor.policy.scripts import restart_whole_job
from goodput.tools.chaos.targets import ChaosContext
from goodput.tools.demo.driver import Driver
from goodput.tools.demo.scenarios import (
    FINGERPRINT_EVERY,
    HANG_MIN_TIMEOUT_S,
    HANG_SAFETY_FACTOR,
    NUMERICS_EVERY,
    STRAGGLER_RATIO,
    DemoScenario,
)
from goodput.tools.simulate.measure import measured_costs
from goodput.tools.stack.launcher import wait_healthy
from goodput.tools.stack.session import StackSession
from goodput.tools.stack.watch import JobWatcher
from goodput.tools.stack.watch import summary as job_summary

Setup = Literal["goodput", "baseline"]
BASELINE_DESCRIPTION = (
    "the same faults, met as a job without goodput does: synchronous torch.save, the whole "
    "job restarted on any fault, a lost node waited for, stragglers ignored, no spare, no "
    "comparison of the replicas (an SDC is trained on)"
)

#: the demo's job: one rank per local node, and (goodput's run) one ready standby per node
DEMO_PROCS_PER_NODE = 1
DEMO_STANDBYS = 1
#: failures are compressed into minutes here, so are the MTBF the checkpoint interval starts
#: from and the window in which repeated failures look like a crash loop
COMPRESSED_TIME = "prior_mtbf_s=120.0"
CRASH_LOOP = "crash_loop={window_s=20.0,max_restarts=3,backoff_s=5.0,max_backoffs=3}"


@dataclass(frozen=True)
class RunPlan:
    setup: Setup
    scenario_name: str
    scenario: DemoScenario
    steps: int
    nodes: int
    spares: int
    ckpt_every: int
    timeout_s: float
    job: str
    #: the example job's rescale rule (``goodput.shim.rescale.BUILTIN_RULES``)
    rescale: str = "keep-global-batch"


#: the demo's sensor thresholds (``goodput.tools.demo.scenarios`` says why each)
SENSOR_THRESHOLDS = (
    f"thresholds={{straggler_ratio={STRAGGLER_RATIO},hang_safety_factor={HANG_SAFETY_FACTOR},"
    f"hang_min_timeout_s={HANG_MIN_TIMEOUT_S}}}"
)


def service_flags(setup: Setup) -> dict[str, list[str]]:
    flags = {
        "hostmon": ["--set", "enable_fault_injection=true"],
        "sensor": ["--set", SENSOR_THRESHOLDS],
    }
    if setup == "goodput":
        settings = f"settings={{checkpoint_interval={{{COMPRESSED_TIME}}},{CRASH_LOOP}}}"
        return {**flags, "controller": ["--set", settings]}
    settings = f"settings={{checkpoint_interval={{enabled=false}},{CRASH_LOOP}}}"
    return {
        **flags,
        "controller": ["--set", settings, "--set", f"policy={restart_whole_job.__file__}"],
        # no tiers to fill a node's volume from before a launch: the checkpoints are shared
        "actuator": ["--set", "restore_timeout_s=0"],
    }


def fingerprint_every(plan: RunPlan) -> int:
    """How often the job compares its replicas: the baseline's period lies past its last step,
    so it never does (the shim has no "off"; a period is a positive multiple of the window)."""
    if plan.setup == "goodput":
        return FINGERPRINT_EVERY
    return NUMERICS_EVERY * (plan.steps // NUMERICS_EVERY + 1)


def start_command(plan: RunPlan, job: str, paths: StateDir) -> schemas.StartJob:
    env = knobs(
        ckpt_every=plan.ckpt_every,
        enable_fault_injection=True,
        numerics_every=NUMERICS_EVERY,
        fingerprint_every=fingerprint_every(plan),
    )
    if plan.setup == "baseline":
        env |= knobs(ckpt_mode="torch-save", ckpt_dir=str(paths.shared_checkpoints))
    return schemas.StartJob(
        job=job,
        argv=supervised_argv(
            plan.steps, "--result", str(paths.training_result), "--rescale", plan.rescale
        ),
        nodes=plan.nodes,
        procs_per_node=DEMO_PROCS_PER_NODE,
        spares=plan.spares,
        env=env,
        # a pre-warmed standby rank per node: the baseline starts every rank cold
        standbys=DEMO_STANDBYS if plan.setup == "goodput" else 0,
    )


@dataclass(frozen=True)
class RunOutcome:
    #: what happened, JSON-ready: steps, world sizes, decisions, faults, goodput and badput
    summary: dict
    report: GoodputReport | None


def run_once(
    args: argparse.Namespace, plan: RunPlan, state_dir: Path, console: Console
) -> RunOutcome:
    """Start the stack in ``state_dir``, run the job through the scenario, stop the stack."""
    started = time.monotonic()
    session = StackSession(state_dir)
    try:
        stack, settings = session.start(
            args, plan.job, plan.nodes + plan.spares, console, service_flags(plan.setup)
        )
        asyncio.run(wait_healthy(settings, stack.job, stack.services, 30, console))
        console.print(
            f"[bold]{plan.setup}[/] · scenario [bold]{plan.scenario_name}[/]: "
            + (plan.scenario.description if plan.setup == "goodput" else BASELINE_DESCRIPTION)
        )
        start = start_command(plan, stack.job, session.paths)
        # the chaos tool's view of the stack just started: its record, its bus
        ctx = ChaosContext(session.paths.root, stack.job, settings, stack=stack)
        watcher, driver, report, costs = asyncio.run(_follow(settings, ctx, start, plan, console))
        result_path = session.paths.training_result
        training = json.loads(result_path.read_text()) if result_path.exists() else {}
    finally:
        session.stop()
    summary = {
        "setup": plan.setup,
        "scenario": plan.scenario_name,
        **job_summary(watcher),
        "steps": training.get("steps", watcher.step),
        "final_params_sha256": training.get("params_sha256"),
        "final_loss": training.get("final_loss"),
        "faults": [entry.as_dict() for entry in driver.injected],
        "goodput_pct": report.goodput_pct if report else None,
        "badput": report.badput if report else {},
        "ettr": report.ettr if report else None,
        "elapsed_s": round(time.monotonic() - started, 2),
        # what `goodput simulate replay` needs to price the same faults as this run met them
        "replay": {
            "nodes": plan.nodes,
            "spares": plan.spares,
            "ckpt_every": plan.ckpt_every,
            "fingerprint_every": fingerprint_every(plan),
            "total_steps": plan.steps,
            "total_s": report.total_s if report else None,
            "faults": [
                {
                    "step": entry.step,
                    "action": entry.fault.action,
                    "node": entry.node,
                    "ok": entry.ok,
                    "factor": entry.fault.factor,
                    "duration_s": entry.fault.duration_s,
                    "repair_after_s": entry.fault.repair_after_s,
                    "repair_at_step": entry.repaired_at_step,
                    "at_ns": entry.at_ns,
                }
                for entry in driver.injected
            ],
            "costs": costs,
        },
    }
    return RunOutcome(summary, report)


async def _follow(
    settings: BusSettings,
    ctx: ChaosContext,
    start: schemas.StartJob,
    plan: RunPlan,
    console: Console,
) -> tuple[JobWatcher, Driver, GoodputReport | None, dict]:
    bus = await Bus.connect(settings, name="goodput-demo")
    # progress goes to stderr (``console``) also with --json: stdout carries only the result
    watcher = await JobWatcher(bus, start.job, plan.steps, console, run_start=start).start()
    driver = Driver(
        ctx,
        watcher,
        plan.scenario,
        plan.steps,
        say=watcher.say,
        job_waits_for_nodes=plan.setup == "baseline",
        compares_replicas=plan.setup == "goodput",
    )
    try:
        await bus.send_command(subjects.ACTUATOR, start)
        driving = asyncio.create_task(driver.run())
        ended = await watcher.wait(plan.timeout_s)
        driving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await driving
        if not ended:
            console.print(f"[red]the job did not finish within {plan.timeout_s:g} s; stopping it")
            await bus.send_command(
                subjects.ACTUATOR, schemas.Stop(job=start.job, reason="demo timed out")
            )
            await watcher.wait(90)
        struck = [(e.at_ns, e.step) for e in driver.injected]
        report, costs = await _goodput(bus, start.job, struck, _slow_windows(driver))
    finally:
        await ctx.close()
        await watcher.stop()
        await bus.close()
    return watcher, driver, report, costs


def _slow_windows(driver: Driver) -> list[tuple[int, int]]:
    """When each straggler the driver injected was slow (epoch ns), in injection order."""
    return [
        (e.at_ns, e.at_ns + int(e.fault.duration_s * 1e9))
        for e in driver.injected
        if e.ok and e.fault.action == "slow-rank"
    ]


async def _goodput(
    bus: Bus, job: str, struck: list[tuple[int, int]], slow_windows: list[tuple[int, int]]
) -> tuple[GoodputReport | None, dict]:
    """The goodput report of the run and its measured costs, from its events in GP_EVENTS."""
    events = await replay_from_bus(bus, job, idle_timeout_s=3.0)
    costs = measured_costs(events, struck, slow_windows)
    try:
        return compute_goodput(events), costs
    except ValueError:
        return None, costs  # no events: the job never ran
