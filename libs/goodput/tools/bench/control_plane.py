"""`goodput bench control-plane`: the control plane at the users' size on this machine.

Simulated ranks (``--nodes`` x ``--procs-per-node``, from two processes for each of
``--publishers`` shares of the nodes: :mod:`.control_plane_fleet`) publish what the shim's
link publishes — heartbeats, a node's steps rolled up per step, checkpoint events every
``--ckpt-every`` steps — and each node its host reports, through a real nats-server,
provisioned as the stack provisions it for that job's scale (``store_sizing``), into the
real sensor and controller, started as `goodput up` starts them. In rounds, one node is
lost (its ranks and host fall silent); the time from then to the sensor's missed-heartbeat
signal is the detection latency, and the node is then restarted (its ranks' ``RankStarted``
close the incident). The other nodes' replicators write the checkpoint index as a fleet's do
(:mod:`.index_fleet`: every node's address and kept copies, one node's checkpoint changing a
second, each address refreshed every 300 s), and one real replicator runs for the last node
(:mod:`.control_plane_replicator`), started as `goodput up` starts it, once they filled the
index. Over the window of the rounds it reports each service's CPU (% of one core) and RSS,
the bus's messages and bytes per second (the server's ``/varz``), the event store's growth
per day against its limit, the services' event backlogs, whether the publishers kept their
rate (:mod:`.control_plane_measure`), and what the replicator received per second (the
server's ``/connz``): in all, the job's ``CheckpointPersisted`` events its wake-up
subscription takes, and the rest (the index's changes, its own replies). The sensor keeps up
when every lost node is detected within the timeout plus two polls plus a second of slack
and no healthy node is reported.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import queue
import statistics
import tempfile
import time
from pathlib import Path

import msgspec
import psutil
from nats.js.api import ConsumerConfig, DeliverPolicy
from rich.console import Console

from goodput import schemas, subjects
from goodput.bus import Bus, BusSettings, EmbeddedNats
from goodput.bus.embedded import free_port
from goodput.bus.store_sizing import StoreScale, scale_to_env, store_limits
from goodput.checkpoint.index.announcement import refresh_s
from goodput.checkpoint.index.index import DEFAULT_NODE_TTL_S
from goodput.shim.config import ShimConfig
from goodput.state_dir import StateDir
from goodput.tools.bench.arguments import add_fleet_nodes, positive_int, positive_ints
from goodput.tools.bench.control_plane_fleet import (
    COUNTERS,
    JOB,
    ROLES,
    FleetShape,
    node_name,
    node_ranks,
    publish,
    shares,
)
from goodput.tools.bench.control_plane_measure import (
    CENTRAL,
    NS,
    POLL_S,
    TIMEOUT_S,
    figures,
    publisher_figures,
    snapshot,
    start_services,
)
from goodput.tools.bench.control_plane_replicator import (
    REPLICATOR_CONNECTION,
    WITNESS_CONNECTION,
    replicator_figures,
    replicator_node,
    replicator_wanted,
    simulated_nodes,
    wait_announced,
    witness,
)
from goodput.tools.bench.control_plane_report import show
from goodput.tools.bench.index_fleet import Writers

#: the link's defaults: a beat every half second, a checkpoint every 50 steps
SHIM_DEFAULTS = {f.name: f.default for f in msgspec.structs.fields(ShimConfig)}
#: a 70B model's step on a few thousand GPUs takes seconds (Llama-3-70B-class runs report
#: 4-10 s per global batch of ~4M tokens): 5 s is a realistic step, and a busier bus than 10 s
DEFAULT_STEP_S = 5.0
#: seconds after the publishers start before the window opens: every rank seen and learned
WARM_UP_S = 5.0
#: the simulated replicators refresh an unchanged address record as the real ones do
ANNOUNCE_S = refresh_s(DEFAULT_NODE_TTL_S)
#: the connections whose received bytes are read from the server
WATCHED = (REPLICATOR_CONNECTION, WITNESS_CONNECTION)


class Fleet:
    """The publisher processes (one per share of the nodes and role) and how to reach those
    that own a node.

    Forked, before this process opens a connection or an event loop: forked, no semaphore
    needs a resource tracker process (spawned publishers would leave one running)."""

    def __init__(self, url: str, shape: FleetShape, shares_count: int):
        context = multiprocessing.get_context("fork")
        self.shape = shape
        self.parts = [(part, role) for part in shares(shape.nodes, shares_count) for role in ROLES]
        self.commands = [context.Queue() for _ in self.parts]
        self.counters = [context.Array("d", len(COUNTERS), lock=False) for _ in self.parts]
        self.stopped_at = context.Value("q", 0)
        self.results = context.Queue()
        self.start_at = time.time() + 1.0 + 0.1 * len(self.parts)  # each connects first
        self.processes = [
            context.Process(
                target=publish,
                args=(
                    *(url, shape, first, last, role, self.start_at),
                    *(commands, counters, self.stopped_at, self.results),
                ),
                daemon=True,
            )
            for ((first, last), role), commands, counters in zip(
                self.parts, self.commands, self.counters, strict=True
            )
        ]
        for process in self.processes:
            process.start()

    def send(self, action: str, node: int = 0) -> None:
        for ((first, last), _), commands in zip(self.parts, self.commands, strict=True):
            if action in ("mark", "quit") or first <= node < last:
                commands.put((action, node))

    def cpu_s(self) -> float:
        """User + system seconds the publishers have used so far."""
        return sum(sum(psutil.Process(p.pid).cpu_times()[:2]) for p in self.processes)

    def stop(self) -> dict[str, list[float]]:
        """Quit every publisher; the lags each role kept after the mark. A publisher that
        died (its traceback is on stderr) ends the bench in one line: its figures are short."""
        self.send("quit")
        lags: dict[str, list[float]] = {role: [] for role in ROLES}
        answered = 0
        try:
            for _ in self.processes:
                role, kept = self.results.get(timeout=60)
                lags[role] += kept
                answered += 1
        except queue.Empty:
            pass
        for process in self.processes:
            process.join(10)
            if process.is_alive():
                process.kill()
        if answered < len(self.processes):
            raise SystemExit(
                f"{len(self.processes) - answered} of {len(self.processes)} publisher processes "
                "did not finish (see their errors above): no figures"
            )
        return lags


async def _rounds(bus: Bus, fleet: Fleet, services, rounds: int, console: Console) -> dict:
    """Silence one node per round and time the sensor's signal; the detection figures."""
    signals: list[schemas.Signal] = []

    async def collect(msg) -> None:
        event = schemas.decode_event(msg.data)
        if isinstance(event, schemas.Signal):
            signals.append(event)

    await bus.js.subscribe(
        subjects.event(JOB, "signal"),
        stream=subjects.EVENTS_STREAM,
        cb=collect,
        ordered_consumer=True,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.NEW),
    )
    shape = fleet.shape
    latencies: list[float] = []
    missed, silent_s = 0, 0.0
    limit = TIMEOUT_S + 2 * POLL_S + 1.0
    victims = [(i * 7919) % shape.nodes for i in range(rounds)]
    for index, victim in enumerate(victims):
        seen = len(signals)
        fleet.send("silence", victim)
        silenced = time.monotonic()
        found = None
        while time.monotonic() - silenced < limit + 5 and found is None:
            found = next((s for s in signals[seen:] if s.node == node_name(victim)), None)
            await asyncio.sleep(0.02)
        if found is None:
            missed += 1
        else:
            latencies.append((found.ts - fleet.stopped_at.value) / NS)
        fleet.send("resume", victim)
        silent_s += time.monotonic() - silenced
        for rank in node_ranks(shape, victim):
            await bus.emit(
                schemas.RankStarted(
                    job=JOB,
                    node=node_name(victim),
                    rank=rank,
                    local_rank=rank % shape.procs_per_node,
                    world_size=shape.ranks,
                    pid=100_000 + rank,
                    attempt=index + 2,
                )
            )
        for service in services:
            service.sample_rss()
        console.print(
            f"  {shape.nodes} x {shape.procs_per_node}, round {index + 1}/{rounds}: "
            + (f"{latencies[-1]:.2f} s" if found else "not detected")
        )
        await asyncio.sleep(1.5)
    false_positives = sum(1 for s in signals if s.node not in {node_name(v) for v in victims})
    return {
        "p50_detect_s": round(statistics.median(latencies), 3) if latencies else None,
        "p99_detect_s": round(_percentile(latencies, 0.99), 3) if latencies else None,
        "missed": missed,
        "false_positives": false_positives,
        "kept_up": missed == 0 and false_positives == 0 and max(latencies, default=99) <= limit,
        "silent_rank_s": silent_s * shape.procs_per_node,
    }


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


async def _measure(
    url: str,
    monitor_port: int,
    server_pid: int,
    fleet: Fleet,
    rounds: int,
    services,
    limits,
    ready_s: float,
) -> dict:
    console = Console(stderr=True)
    shape = fleet.shape
    connections: list[Bus] = []
    loops: list[asyncio.Task] = []
    try:
        bus = await Bus.connect(BusSettings(url=url), name="goodput-bench-control-plane")
        connections.append(bus)
        connections.append(await witness(url))
        writers_bus = await Bus.connect(BusSettings(url=url), name="goodput-bench-index-writers")
        connections.append(writers_bus)
        writers = Writers(
            writers_bus, JOB, simulated_nodes(shape.nodes), shape.procs_per_node, ANNOUNCE_S
        )
        loops += [asyncio.create_task(writers.churn()), asyncio.create_task(writers.announce())]
        await asyncio.sleep(max(fleet.start_at - time.time(), 0) + WARM_UP_S)
        server = psutil.Process(server_pid)
        before = await snapshot(
            bus, services, server, monitor_port, fleet.counters, fleet.cpu_s(), WATCHED
        )
        written = [(writers.copy_writes, writers.announcements)]
        fleet.send("mark")
        detection = await _rounds(bus, fleet, services, rounds, console)
        after = await snapshot(
            bus, services, server, monitor_port, fleet.counters, fleet.cpu_s(), WATCHED
        )
        written.append((writers.copy_writes, writers.announcements))
    finally:
        for loop in loops:
            loop.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        lags = fleet.stop()
        for connection in connections:
            await connection.close()
    window = after.wall - before.wall
    due = (shape.ranks * window - detection.pop("silent_rank_s")) / shape.heartbeat_s / window
    return {
        "nodes": shape.nodes,
        "procs_per_node": shape.procs_per_node,
        "ranks": shape.ranks,
        **detection,
        **figures(before, after, services, limits.streams[subjects.EVENTS_STREAM]),
        "events_formula_bytes_per_day": round(limits.events_per_s_bytes * 86400),
        "publishers": publisher_figures(before, after, due, lags),
        "replicator": replicator_figures(
            before, after, replicator_node(shape.nodes), ready_s, written
        ),
    }


def _one_size(nodes: int, args: argparse.Namespace) -> dict:
    shape = FleetShape(
        nodes=nodes,
        procs_per_node=args.procs_per_node,
        heartbeat_s=args.heartbeat_s,
        step_s=args.step_s,
        ckpt_every=args.ckpt_every,
        host_report_s=args.host_report_s,
    )
    # the job's scale, as its operator would tell the bus (GOODPUT_STORE_SCALE)
    scale = StoreScale(
        nodes=nodes,
        ranks_per_node=args.procs_per_node,
        step_s=args.step_s,
        checkpoint_s=args.step_s * args.ckpt_every,
        host_report_s=args.host_report_s,
    )
    limits = store_limits(scale)
    monitor_port = free_port()
    with tempfile.TemporaryDirectory(prefix="goodput-bench-cp-") as tmp:
        state_dir = Path(tmp)
        with EmbeddedNats(
            StateDir(state_dir), store_bytes=limits.server_bytes, monitor_port=monitor_port
        ) as server:
            asyncio.run(_prepare(server.url, scale, shape))
            wanted = [*CENTRAL, replicator_wanted(nodes, state_dir)]
            started = time.monotonic()
            services = start_services(server.url, state_dir, scale_to_env(scale), wanted)
            try:
                # the replicator's complete read done, then the others subscribed and leading
                ready_s = asyncio.run(
                    wait_announced(server.url, replicator_node(nodes), services[-1].log, started)
                )
                time.sleep(2.0)
                assert server.process is not None
                fleet = Fleet(server.url, shape, args.publishers)
                return asyncio.run(
                    _measure(
                        server.url,
                        monitor_port,
                        server.process.pid,
                        fleet,
                        args.rounds,
                        services,
                        limits,
                        ready_s,
                    )
                )
            finally:
                for service in services:
                    service.stop()


def run(args: argparse.Namespace) -> int:
    sweep = [_one_size(nodes, args) for nodes in args.nodes]
    kept = [r["ranks"] for r in sweep if r["kept_up"]]
    result = {
        **sweep[-1],
        "sweep": sweep,
        "max_ranks_kept_up": max(kept) if kept else 0,
        "heartbeat_timeout_s": TIMEOUT_S,
        "heartbeat_polling_period_s": POLL_S,
        "heartbeat_s": args.heartbeat_s,
        "step_s": args.step_s,
        "ckpt_every": args.ckpt_every,
        "host_report_s": args.host_report_s,
        "publisher_processes": args.publishers * len(ROLES),
        "cpus": psutil.cpu_count(),
        "load_average": [round(x, 2) for x in psutil.getloadavg()],
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        show(result)
    return 0


async def _prepare(url: str, scale: StoreScale, shape: FleetShape) -> None:
    """The bus provisioned for the job's scale, and the index as the simulated nodes'
    replicators wrote it before the real one starts (it reads it all at start)."""
    bus = await Bus.connect(BusSettings(url=url), name="goodput-bench")
    try:
        await bus.provision(scale=scale)
        nodes = simulated_nodes(shape.nodes)
        await Writers(bus, JOB, nodes, shape.procs_per_node, ANNOUNCE_S).fill()
    finally:
        await bus.close()


def _node_counts(text: str) -> list[int]:
    counts = positive_ints(text)
    if min(counts) < 2:
        raise argparse.ArgumentTypeError(
            f"at least 2 nodes each ({text}): the real replicator's and another's index"
        )
    return counts


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, not {text}")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "control-plane",
        help="sensor, controller and a replicator's CPU, bus traffic, a replicator's reads, "
        "store growth and detection at fleet size",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_fleet_nodes(parser, _node_counts)
    parser.add_argument(
        "--procs-per-node", type=positive_int, default=8, help="ranks per node (default 8)"
    )
    parser.add_argument(
        "--heartbeat-s",
        type=_positive_float,
        default=SHIM_DEFAULTS["heartbeat_period_s"],
        help="each rank's heartbeat period, the link's (default %(default)g)",
    )
    parser.add_argument(
        "--step-s",
        type=_positive_float,
        default=DEFAULT_STEP_S,
        help="seconds per training step: a StepsDone per node per step (default %(default)g, "
        "a 70B model's step on thousands of GPUs)",
    )
    parser.add_argument(
        "--ckpt-every",
        type=positive_int,
        default=SHIM_DEFAULTS["ckpt_every"],
        help="steps between checkpoints: each rank's CheckpointSaved, and a step later its "
        "CheckpointPersisted (default %(default)d, the shim's)",
    )
    parser.add_argument(
        "--host-report-s",
        type=_positive_float,
        default=StoreScale().host_report_s,
        help="seconds between a node's host reports, the host monitor's (default %(default)g)",
    )
    parser.add_argument(
        "--publishers",
        type=positive_int,
        default=4,
        help="shares of the nodes, each published by two processes: its ranks' heartbeats, "
        "and its events (default 4: 8 processes)",
    )
    parser.add_argument("--rounds", type=positive_int, default=6, help="silent nodes per size")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=run)
