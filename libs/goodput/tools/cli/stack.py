"""`goodput up`, `goodput down`: the supervisor stack (:mod:`goodput.tools.stack.launcher`) from the
command line; its health: `goodput status`."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from rich.console import Console

from goodput.bus.store_sizing import SCALE_ENV, StoreScaleError, parse_scale
from goodput.config import (
    add_bus_arguments,
    add_state_dir_argument,
    count_at_least,
    job_name,
)
from goodput.launch import capacity
from goodput.subjects import DEFAULT_JOB
from goodput.tools.stack.launcher import (
    ServiceExited,
    add_embedded_nats_arguments,
    add_service_set_argument,
    check_policy_options,
    service_flags_from_args,
    wait_healthy,
)
from goodput.tools.stack.session import StackSession


def cmd_up(args: argparse.Namespace) -> int:
    problems = capacity.local_stack_problems(nodes=args.nodes, host=capacity.read_host_facts())
    if problems:
        print(f"goodput up: {'; '.join(problems)}", file=sys.stderr)
        return 2
    console = Console(stderr=True)
    session = StackSession(args.state_dir)
    service_flags = service_flags_from_args(args.service_set)
    check_policy_options(service_flags)
    if args.store_scale:
        # the embedded server, the provisioning and every service started read it from here
        os.environ[SCALE_ENV] = args.store_scale
    # held until the stack is healthy: a second `up` then finds it whole, and what this one
    # undoes on a failure is what it started, not what a concurrent `up` did
    with session.hold():
        stack, settings = session.start(args, args.job, args.nodes, console, service_flags)
        if args.wait <= 0:
            return 0
        try:
            report = asyncio.run(
                wait_healthy(settings, stack.job, stack.services, args.wait, console)
            )
        except ServiceExited as exc:
            session.undo()
            print(f"goodput up: {exc.code} (stopped what this command started)", file=sys.stderr)
            return 1
    unhealthy = [s["name"] for s in report if not s["healthy"]]
    if unhealthy:
        console.print(f"[red]not healthy after {args.wait:.0f} s:[/] {', '.join(unhealthy)}")
        console.print(f"logs: {session.paths.logs}", soft_wrap=True)
        return 1
    console.print(
        f"[green]all {len(report)} services healthy[/]; bus {stack.url}; state {session.paths.root}"
    )
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    report = StackSession(args.state_dir).stop()
    for line in report.unreadable:
        print(f"goodput down: {line}", file=sys.stderr)
    if report.stale:
        print(f"goodput down: stale record, not signalled: {'; '.join(report.stale)}",
              file=sys.stderr)  # fmt: skip
    swept = f"; removed {report.segments} shared-memory segment(s) of exited ranks"
    print(
        f"stopped {report.stopped} process(es) of the stack (services, ranks left running, "
        f"the embedded server){swept if report.segments else ''} (stack state: {args.state_dir})",
        file=sys.stderr,
    )
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    up = subparsers.add_parser(
        "up",
        help="start the supervisor stack (embedded NATS + every service as its own process)",
        description=(
            "Start NATS (embedded, loopback only, unless --nats-url is given) and every goodput "
            "service as a separate OS process, so any one can be killed, restarted or replaced. "
            "Running `up` again starts only what is missing."
        ),
    )
    add_stack_arguments(up)
    up.add_argument(
        "--nodes",
        type=count_at_least(0),
        default=1,
        help="local nodes (one host monitor and one checkpoint tier each); 0: the central "
        "services only, where node agents start each node's own (Slurm, Kubernetes)",
    )
    up.add_argument(
        "--nats-port",
        type=int,
        default=None,
        help="port of the embedded server (default: a free one)",
    )
    add_embedded_nats_arguments(up)
    up.add_argument(
        "--store-scale",
        type=store_scale,
        help="the job the bus's streams, buckets and embedded store are sized for, e.g. "
        "nodes=64,ranks_per_node=8,keep_h=24 (default: $GOODPUT_STORE_SCALE, else 16 nodes "
        "of 8 ranks; `goodput bench store` prints the limits)",
    )
    up.add_argument(
        "--wait",
        type=float,
        default=20.0,
        help="seconds to wait for every service to be healthy (0: don't)",
    )
    add_service_set_argument(up)
    add_bus_arguments(up)
    up.set_defaults(func=cmd_up)

    down = subparsers.add_parser("down", help="stop the stack started by `goodput up`")
    add_stack_arguments(down)
    down.set_defaults(func=cmd_down)


def store_scale(text: str) -> str:
    """argparse type of ``--store-scale``: checked here, passed on as the variable's text."""
    try:
        parse_scale(text, "--store-scale")
    except StoreScaleError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def add_stack_arguments(parser: argparse.ArgumentParser) -> None:
    """``--state-dir`` and ``--job`` of the commands that start or stop a stack."""
    add_state_dir_argument(parser, "where the stack keeps its state")
    parser.add_argument(
        "--job", type=job_name, default=DEFAULT_JOB, help=f"job name (default: {DEFAULT_JOB!r})"
    )
