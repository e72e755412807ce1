"""`goodput run`: launch a training script under supervision on the local backend."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

from rich.console import Console

from goodput import schemas, subjects
from goodput.bus import Bus, BusSettings
from goodput.cli.stack import add_stack_arguments
from goodput.config import add_bus_arguments, count_at_least
from goodput.rank_env import knobs
from goodput.stack.launcher import (
    add_service_set_argument,
    check_policy_options,
    read_stack,
    service_flags_from_args,
    start_stack,
    stop_stack,
    wait_healthy,
)
from goodput.stack.runs import find_clash
from goodput.stack.watch import JobWatcher, summary


async def supervise(
    settings: BusSettings,
    start: schemas.StartJob,
    *,
    total_steps: int,
    timeout_s: float,
    console: Console | None,
) -> JobWatcher:
    """Send the start command and follow the new run until it ends (or ``timeout_s`` passes);
    refused (``watcher.state``) if a run of the job is going."""
    bus = await Bus.connect(settings, name="goodput-run")
    watcher = await JobWatcher(bus, start.job, total_steps, console, run_start=start).start()
    try:
        clash = await find_clash(bus, start.job)
        if clash is not None:
            watcher.state, watcher.refusal = "refused", clash
            return watcher
        await bus.send_command(subjects.ACTUATOR, start)
        if not await watcher.wait(timeout_s):
            await bus.send_command(
                subjects.ACTUATOR, schemas.Stop(job=start.job, reason="goodput run timed out")
            )
            await watcher.wait(90)
    except asyncio.CancelledError:
        await bus.send_command(subjects.ACTUATOR, schemas.Stop(job=start.job, reason="interrupted"))
        raise
    finally:
        await watcher.stop()
        await bus.close()
    return watcher


def cmd_run(args: argparse.Namespace) -> int:
    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        print("goodput run: give the training command after --", file=sys.stderr)
        return 2
    if argv[0] in ("python", "python3"):
        # the interpreter goodput runs in has goodput (and torch) installed
        argv[0] = sys.executable
    console = Console(stderr=True)
    state_dir = args.state_dir
    service_flags = service_flags_from_args(args.service_set)
    check_policy_options(service_flags)
    console.print(f"stack state: {state_dir}")
    started_here = read_stack(state_dir) is None
    stack, settings = start_stack(
        args, state_dir, args.job, args.nodes + args.spares, console, service_flags
    )
    try:
        asyncio.run(wait_healthy(settings, stack.job, stack.services, 30, console))
        env = dict(args.env)
        if args.ckpt_every is not None:
            env.update(knobs(ckpt_every=args.ckpt_every))
        start = schemas.StartJob(
            job=stack.job,
            argv=argv,
            nodes=args.nodes,
            procs_per_node=args.procs_per_node,
            spares=args.spares,
            num_nodes_per_dp=args.nodes_per_dp,
            env=env,
            workdir=os.getcwd(),
        )
        watcher = asyncio.run(
            supervise(
                settings,
                start,
                total_steps=args.steps or 0,
                timeout_s=args.timeout,
                console=None if args.json else console,
            )
        )
    finally:
        if started_here and not args.keep_stack:
            stop_stack(state_dir)
    if watcher.state == "refused":
        print(f"goodput run: {watcher.refusal}", file=sys.stderr)
        return 1
    result = summary(watcher)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        console.print(
            f"job {result['state']}: {result['steps']} steps, {result['restarts']} restart(s), "
            f"world sizes {result['world_size_history']}"
        )
    return 0 if watcher.state == "finished" else 1


def environment_item(text: str) -> tuple[str, str]:
    """argparse type of ``--env KEY=VALUE``."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "run",
        help="launch a training script under supervision (local backend)",
        description=(
            "Start the stack if needed, launch N local nodes of P rank processes each (torchrun "
            "environment: RANK, WORLD_SIZE, MASTER_ADDR/PORT), keep S spare nodes, and remediate "
            "failures by policy until the job finishes. A command starting with python or python3 "
            "runs in goodput's own interpreter. Example: goodput run --nodes 2 "
            "--procs-per-node 1 --spares 1 -- python -m goodput.examples.gpt.supervised --steps 200"
        ),
    )
    parser.add_argument(
        "--nodes", type=count_at_least(1), default=2, help="active nodes (default 2)"
    )
    parser.add_argument(
        "--procs-per-node", type=count_at_least(1), default=1, help="ranks per node (default 1)"
    )
    parser.add_argument(
        "--spares", type=count_at_least(0), default=1, help="spare nodes (default 1)"
    )
    parser.add_argument(
        "--nodes-per-dp",
        type=count_at_least(1),
        default=1,
        help="nodes per data-parallel replica",
    )
    parser.add_argument("--ckpt-every", type=count_at_least(1), help="checkpoint interval in steps")
    parser.add_argument("--steps", type=int, help="expected steps, for the progress bar")
    parser.add_argument(
        "--env",
        action="append",
        type=environment_item,
        default=[],
        metavar="KEY=VALUE",
        help="extra environment for the ranks",
    )
    parser.add_argument(
        "--timeout", type=float, default=3600.0, help="stop the job after this many seconds"
    )
    add_stack_arguments(parser)
    parser.add_argument(
        "--keep-stack", action="store_true", help="leave the stack running afterwards"
    )
    parser.add_argument("--json", action="store_true", help="print a JSON summary")
    add_service_set_argument(parser)
    add_bus_arguments(parser)
    parser.add_argument("argv", nargs=argparse.REMAINDER, help="-- the training command")
    parser.set_defaults(func=cmd_run)
