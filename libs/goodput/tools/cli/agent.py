"""`goodput agent --node NAME`: the node agent of one host (``goodput.supervisor.agent``).

Run one per host — ``srun --ntasks-per-node=1 goodput agent`` under Slurm (the node name is
then the host's Slurm name), a systemd unit, or by hand — against the bus of a stack whose
actuator runs ``backend = "agent"``. It runs until SIGTERM/SIGINT (its ranks save and exit).
A node name a live agent holds is refused with one line, exit 1.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import sys
from pathlib import Path
from urllib.parse import urlparse

import msgspec

from goodput.bus import BusSettingsError, BusUnavailableError
from goodput.config import (
    add_bus_arguments,
    add_state_dir_argument,
    bus_settings_from_args,
    job_name,
)
from goodput.logs import setup_logging
from goodput.subjects import DEFAULT_JOB, check_token
from goodput.supervisor.agent.host import host_address, is_loopback, visible_gpus
from goodput.supervisor.agent.registry import NodeHeld
from goodput.supervisor.agent.slurm import SlurmEnvError, agent_node_name, read_slurm
from goodput.tools.stack.launcher import resolve_url


def cmd_agent(args: argparse.Namespace) -> int:
    try:
        slurm = read_slurm(os.environ)
        node = args.node or agent_node_name(os.environ) or socket.gethostname().split(".")[0]
        check_token(node, "node name")
    except (SlurmEnvError, ValueError) as exc:
        print(f"goodput agent: {exc}", file=sys.stderr)
        return 2
    state_dir = Path(args.state_dir).resolve()
    url, _ = resolve_url(args, state_dir)
    if not url:
        print(f"goodput agent: no bus: give --nats-url (the stack's bus, reachable from this "
              f"host), or start one with `goodput up --state-dir {state_dir}`", file=sys.stderr)  # fmt: skip
        return 2
    try:
        settings = msgspec.structs.replace(bus_settings_from_args(args), url=url)
        settings.check_security()
    except BusSettingsError as exc:
        print(f"goodput agent: {exc}", file=sys.stderr)
        return 2
    bus_host = urlparse(url.split(",")[0]).hostname or ""
    address = args.address or host_address(bus_host)
    setup_logging(args.log_level, service="agent", node=node)
    if is_loopback(address):
        print(f"goodput agent: warning: {node}'s address is loopback ({address}): ranks on other "
              "hosts cannot reach its rendezvous; give --address", file=sys.stderr)  # fmt: skip
    from goodput.supervisor.agent.node import AgentLoopDied, NodeAgent

    gpus = visible_gpus(os.environ)
    if not gpus and slurm is not None and slurm.gpus_on_node:
        gpus = list(range(slurm.gpus_on_node))

    agent = NodeAgent(
        job=args.job,
        node=node,
        address=address,
        gpus=gpus,
        bus_settings=settings,
        state_dir=state_dir / "agents" / node,
        host_report=not args.no_host_report,
    )
    try:
        asyncio.run(_run(agent))
    except NodeHeld as exc:
        print(f"goodput agent: {exc}", file=sys.stderr)
        return 1
    except (BusUnavailableError, AgentLoopDied) as exc:
        print(f"goodput agent: {exc}", file=sys.stderr)
        return 1
    return 0


async def _run(agent) -> None:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await agent.run(stopping)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "agent",
        help="the node agent of this host: starts and reports its ranks for the `agent` backend",
        description=(
            "Announce this host on the bus and start, signal and report its ranks on the "
            "commands of an actuator running backend=agent. One per host: `srun "
            "--ntasks-per-node=1 goodput agent` under Slurm (README: Slurm), a systemd unit, "
            "or by hand."
        ),
    )
    parser.add_argument(
        "--node",
        help="this host's node name (default: SLURMD_NODENAME under Slurm, else the host name)",
    )
    parser.add_argument("--job", type=job_name, default=DEFAULT_JOB, help="the job it serves")
    parser.add_argument(
        "--address",
        help="the address other hosts reach this one at (default: the interface toward the bus)",
    )
    parser.add_argument(
        "--no-host-report",
        action="store_true",
        help="send no host reports: a host monitor (goodput-hostmon) reports this node",
    )
    parser.add_argument("--log-level", default="info", help="debug, info, warning or error")
    add_state_dir_argument(parser, "where the ranks' logs go (agents/<node>/logs)")
    add_bus_arguments(parser)
    parser.set_defaults(func=cmd_agent)
