"""`goodput demo`: the whole system on embedded defaults, with a fault scenario.

It starts the embedded NATS server and every service, runs the example GPT job on local nodes
(with a spare where the scenario wants one), injects the scenario's faults as training
progresses, and reports what happened: steps, world sizes, restarts, the decisions taken, and
the hash of the final parameters (equal to an uninterrupted run's when the world size is).
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
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from goodput import schemas, subjects
from goodput.accounting import GoodputReport, compute_goodput, replay_from_bus
from goodput.accounting.html import write_html_report
from goodput.accounting.table import render as render_report
from goodput.bus import Bus, BusSettings
from goodput.cli.run import summary
from goodput.cli.stack import start_stack, stop_stack, wait_healthy
from goodput.cli.watch import JobWatcher
from goodput.config import add_bus_arguments


@dataclass(frozen=True)
class Fault:
    """One injected fault: what, on which node, once training passed ``at`` of the steps."""

    at: float
    action: str  # kill-rank | terminate-node | fail-node | return-node
    node: str


@dataclass(frozen=True)
class Scenario:
    description: str
    faults: tuple[Fault, ...]
    spares: int


SCENARIOS: dict[str, Scenario] = {
    "none": Scenario("no fault: the reference run", (), spares=1),
    "kill-twice": Scenario(
        "kill -9 of a rank (in-job restart), then SIGTERM of a node (hot swap to the spare)",
        (Fault(0.25, "kill-rank", "node-1"), Fault(0.55, "terminate-node", "node-0")),
        spares=1,
    ),
    "hot-swap": Scenario(
        "a node fails while a spare exists: swapped, same world size",
        (Fault(0.35, "fail-node", "node-1"),),
        spares=1,
    ),
    "scale-down-up": Scenario(
        "a node fails with no spare (scale down), then comes back (scale up)",
        (Fault(0.25, "fail-node", "node-1"), Fault(0.55, "return-node", "node-1")),
        spares=0,
    ),
}


async def _inject(bus: Bus, job: str, fault: Fault, status: schemas.JobStatus) -> str:
    pids = status.pids.get(fault.node, [])
    hostmon = subjects.node_target(subjects.HOST_MONITOR, fault.node)
    match fault.action:
        case "kill-rank":
            _signal(pids[:1], signal.SIGKILL)
            return f"kill -9 rank process {pids[:1]} on {fault.node}"
        case "terminate-node":
            _signal(pids, signal.SIGTERM)
            return f"SIGTERM to every rank of {fault.node} (the node is being taken away)"
        case "fail-node":
            await bus.send_command(
                hostmon, schemas.InjectFault(job=job, node=fault.node, fault="node_down")
            )
            _signal(pids, signal.SIGKILL)
            return f"{fault.node} fails: host down, its ranks killed"
        case "return-node":
            await bus.send_command(
                hostmon,
                schemas.InjectFault(job=job, node=fault.node, fault="node_down", clear=True),
            )
            return f"{fault.node} is repaired and healthy again"
    raise ValueError(f"unknown fault action {fault.action!r}")


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def _ready(watcher: JobWatcher, fault: Fault, steps: int, last_attempt: int) -> bool:
    """Training passed the fault's point and runs again after the previous fault."""
    status = watcher.last_status
    if status is None or status.state != "running" or watcher.attempt <= last_attempt:
        return False
    if watcher.step < fault.at * steps:
        return False
    return fault.action == "return-node" or bool(status.pids.get(fault.node))


async def _drive(
    bus: Bus, watcher: JobWatcher, scenario: Scenario, steps: int, console, injected: list[dict]
) -> None:
    """Inject each fault once training passed its point and recovered from the previous one."""
    last_attempt = 0
    for fault in scenario.faults:
        while not _ready(watcher, fault, steps, last_attempt):
            if watcher.ended.is_set():
                return
            await asyncio.sleep(0.1)
        assert watcher.last_status is not None
        last_attempt = watcher.attempt
        what = await _inject(bus, watcher.job, fault, watcher.last_status)
        injected.append(
            {"step": watcher.step, "fault": fault.action, "node": fault.node, "what": what}
        )
        if console is not None:
            console.print(f"[red]fault[/] at step {watcher.step}: {what}")


async def _run_scenario(
    settings: BusSettings,
    start: schemas.StartJob,
    scenario: Scenario,
    steps: int,
    timeout_s: float,
    console,
) -> tuple[JobWatcher, list, GoodputReport | None]:
    bus = await Bus.connect(settings, name="goodput-demo")
    watcher = await JobWatcher(bus, start.job, steps, console).start()
    try:
        await bus.send_command(subjects.ACTUATOR, start)
        injected: list[dict] = []
        driver = asyncio.create_task(_drive(bus, watcher, scenario, steps, console, injected))
        ended = await watcher.wait(timeout_s)
        driver.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await driver
        if not ended:
            await bus.send_command(
                subjects.ACTUATOR, schemas.Stop(job=start.job, reason="demo timed out")
            )
            await watcher.wait(90)
        report = await _goodput(bus, start.job)
    finally:
        await watcher.stop()
        await bus.close()
    return watcher, injected, report


async def _goodput(bus: Bus, job: str) -> GoodputReport | None:
    """The goodput report of the run, from its events in GP_EVENTS."""
    try:
        return compute_goodput(await replay_from_bus(bus, job, idle_timeout_s=3.0))
    except ValueError:
        return None  # no events: the job never ran


def run(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    scenario = SCENARIOS[args.scenario]
    spares = scenario.spares if args.spares is None else args.spares
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="goodput-demo-") as tmp:
        state_dir = Path(args.state_dir or tmp).resolve()
        result_path = state_dir / "training-result.json"
        service_flags = {
            "hostmon": ["--set", "enable_fault_injection=true"],
            # failures are compressed into minutes here: so is the MTBF the interval starts from
            "controller": ["--set", "settings={checkpoint_interval={prior_mtbf_s=120.0}}"],
        }
        try:
            stack, settings = start_stack(
                args, state_dir, args.job, args.nodes + spares, console, service_flags
            )
            asyncio.run(wait_healthy(settings, stack.job, stack.services, 30, console))
            console.print(f"[bold]scenario {args.scenario}[/]: {scenario.description}")
            start = schemas.StartJob(
                job=stack.job,
                argv=[
                    sys.executable,
                    "-m",
                    "goodput.examples.gpt.supervised",
                    "--steps",
                    str(args.steps),
                    "--result",
                    str(result_path),
                    "--log-every",
                    "0",
                ],
                nodes=args.nodes,
                procs_per_node=1,
                spares=spares,
                env={"GOODPUT_CKPT_EVERY": str(args.ckpt_every)},
            )
            watcher, injected, report = asyncio.run(
                _run_scenario(
                    settings,
                    start,
                    scenario,
                    args.steps,
                    args.timeout,
                    None if args.json else console,
                )
            )
            training = json.loads(result_path.read_text()) if result_path.exists() else {}
        finally:
            stop_stack(state_dir)
    result = {
        "scenario": args.scenario,
        **summary(watcher),
        "steps": training.get("steps", watcher.step),
        "final_params_sha256": training.get("params_sha256"),
        "final_loss": training.get("final_loss"),
        "faults": injected,
        "goodput_pct": report.goodput_pct if report else None,
        "badput": report.badput if report else {},
        "ettr": report.ettr if report else None,
        "elapsed_s": round(time.monotonic() - started, 2),
    }
    if report is not None and args.html:
        result["html_report"] = str(write_html_report(report, args.html))
    ok = watcher.state == "finished" and result["steps"] == args.steps
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print_summary(result)
        if report is not None:
            Console().print(render_report(report))
        if "html_report" in result:
            console.print(f"HTML report: {result['html_report']}")
    return 0 if ok else 1


def _print_summary(result: dict) -> None:
    table = Table(title=f"goodput demo — scenario {result['scenario']}")
    table.add_column("what")
    table.add_column("value")
    for key in (
        "state",
        "steps",
        "restarts",
        "world_size_history",
        "final_loss",
        "final_params_sha256",
        "elapsed_s",
    ):
        table.add_row(key, str(result[key]))
    Console().print(table)
    for decision in result["decisions"]:
        Console().print(f"decision [magenta]{decision['rule']}[/]: {decision['reason']}")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="the main job: the whole system on embedded defaults, with a fault scenario",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--scenario",
        choices=sorted(SCENARIOS),
        default="kill-twice",
        help="faults to inject (default: kill-twice); "
        + "; ".join(f"{k}: {v.description}" for k, v in SCENARIOS.items()),
    )
    parser.add_argument("--steps", type=int, default=200, help="training steps (default 200)")
    parser.add_argument("--nodes", type=int, default=2, help="active local nodes (default 2)")
    parser.add_argument("--spares", type=int, help="spare nodes (default: what the scenario needs)")
    parser.add_argument(
        "--ckpt-every", type=int, default=20, help="initial checkpoint interval in steps"
    )
    parser.add_argument(
        "--timeout", type=float, default=900.0, help="give up after this many seconds"
    )
    parser.add_argument("--state-dir", help="keep the demo's state here (default: a temp dir)")
    parser.add_argument("--job", default="demo", help="job name (default: demo)")
    parser.add_argument(
        "--html",
        default="goodput-demo-report",
        help="directory for the HTML goodput report with its plots ('' for none; default "
        "./goodput-demo-report)",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    add_bus_arguments(parser)
    parser.set_defaults(func=run)
