"""`goodput agent --node NAME`: the node agent of one host (``goodput.supervisor.agent``).

Run one per host — ``srun --ntasks-per-node=1 goodput agent`` under Slurm (the node name is
then the host's Slurm name), a systemd unit, or by hand — against the bus of a stack whose
actuator runs ``backend = "agent"``. It runs until SIGTERM/SIGINT (its ranks save and exit,
then its node daemons stop). A node name a live agent holds is refused with one line, exit 1;
so is a loopback address while the bus is on another host (the rendezvous, the collectives
and the peer data plane all use the agent's address: ``MASTER_ADDR``, the interface named in
``GLOO_SOCKET_IFNAME``/``NCCL_SOCKET_IFNAME``, the replicator's advertised address).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
from pathlib import Path
from urllib.parse import urlparse

import msgspec

from goodput.bus import BusSettingsError, BusUnavailableError
from goodput.bus.settings import settings_to_env
from goodput.checkpoint.tiers.peer.address import PEER_PORT
from goodput.config import (
    add_bus_arguments,
    add_state_dir_argument,
    bus_settings_from_args,
    job_name,
)
from goodput.launch.collective_sockets import (
    VARIABLES,
    host_interfaces,
    interface_holding,
    socket_env,
)
from goodput.logs import setup_logging
from goodput.state_dir import StateDir
from goodput.subjects import DEFAULT_JOB, check_token
from goodput.supervisor.agent.daemons import DaemonSettings, NodeDaemons
from goodput.supervisor.agent.host import host_address, is_loopback, visible_gpus
from goodput.supervisor.agent.registry import NodeHeld
from goodput.supervisor.agent.slurm import SlurmEnvError, agent_node_name, read_slurm
from goodput.tools.stack.launcher import resolve_url

log = logging.getLogger(__name__)


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
    if is_loopback(address) and not is_loopback(bus_host):
        how = "give --address" if not args.address else "give an address the other hosts reach"
        print(f"goodput agent: {node}'s address would be the loopback address {address} while "
              f"the bus ({bus_host}) is on another host: ranks and replicators on other hosts "
              f"could not reach this one; {how}", file=sys.stderr)  # fmt: skip
        return 2
    setup_logging(args.log_level, service="agent", node=node)
    interface = interface_holding(address, host_interfaces())
    host_env = socket_env(interface, os.environ)
    if interface is None:
        log.warning("no interface of this host holds %s: %s left to torch (set them to "
                    "the interface that reaches the other hosts)", address, " and ".join(VARIABLES))  # fmt: skip
    from goodput.supervisor.agent.node import AgentLoopDied, NodeAgent

    gpus = visible_gpus(os.environ)
    if not gpus and slurm is not None and slurm.gpus_on_node:
        gpus = list(range(slurm.gpus_on_node))

    agent_dir = StateDir(state_dir).agent(node).root
    daemons = None
    if not args.no_node_daemons:
        daemon_settings = DaemonSettings(
            job=args.job,
            node=node,
            state_dir=agent_dir,
            address=address,
            peer_port=args.peer_port,
            config=str(Path(args.config).resolve()) if args.config else "",
            log_level=args.log_level,
        )
        daemons = NodeDaemons(daemon_settings, settings_to_env(settings))
    agent = NodeAgent(
        job=args.job,
        node=node,
        address=address,
        gpus=gpus,
        bus_settings=settings,
        state_dir=agent_dir,
        # the host monitor it runs reports the node; two reporters would disagree
        host_report=not args.no_host_report and daemons is None,
        daemons=daemons,
        host_env=host_env,
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
            "commands of an actuator running backend=agent. It also runs this node's host "
            "monitor and replicator (the checkpoints' local, peer and object-store tiers; "
            "logs under STATE/agents/NODE/logs), unless --no-node-daemons. Its ranks get "
            "GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME naming the interface of --address, "
            "unless set already. One per host: `srun --ntasks-per-node=1 goodput agent` "
            "under Slurm (README: Slurm), a systemd unit, or by hand. Give it the job's "
            "checkpoint key as GOODPUT_CKPT_KEY_FILE, the path the actuator has (the same on "
            "every host): the replicator signs and checks with it."
        ),
    )
    parser.add_argument(
        "--node",
        help="this host's node name (default: SLURMD_NODENAME under Slurm, else the host name)",
    )
    parser.add_argument("--job", type=job_name, default=DEFAULT_JOB, help="the job it serves")
    parser.add_argument(
        "--address",
        help="the address other hosts reach this one at: the rendezvous, the collectives and "
        "the replicator use it (default: this host's address toward the bus)",
    )
    parser.add_argument(
        "--no-node-daemons",
        action="store_true",
        help="do not run this node's host monitor and replicator (they run elsewhere, e.g. "
        "Kubernetes' DaemonSets): the agent then sends the host reports itself",
    )
    parser.add_argument(
        "--peer-port",
        type=int,
        default=PEER_PORT,
        help=f"the replicator's peer port on this host's address (default {PEER_PORT}; "
        "open it between the job's hosts)",
    )
    parser.add_argument(
        "--config",
        help="goodput.toml whose [services.replicator] and [services.hostmon] tables the node "
        "daemons read (e.g. the replicator's object_store)",
    )
    parser.add_argument(
        "--no-host-report",
        action="store_true",
        help="with --no-node-daemons: send no host reports either (a host monitor run "
        "elsewhere reports this node)",
    )
    parser.add_argument("--log-level", default="info", help="debug, info, warning or error")
    add_state_dir_argument(parser, "where the ranks' logs go (agents/<node>/logs)")
    add_bus_arguments(parser)
    parser.set_defaults(func=cmd_agent)
