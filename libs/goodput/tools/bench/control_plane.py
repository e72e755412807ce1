"""`goodput bench control-plane`: can one sensor watch thousands of nodes on this machine?

Simulated nodes (one rank each, in a separate publisher process) heartbeat at 1 Hz over the
real embedded NATS server to the real sensor service process. In rounds, one node falls
silent; the time from its last heartbeat to the sensor's missed-heartbeat signal is the
detection latency, and the node is then restarted (a RankStarted closes the incident). The
sensor keeps up when every silent node is detected within the timeout plus two polls plus
a second of slack and no healthy node is ever reported.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
from nats.js.api import ConsumerConfig, DeliverPolicy
from rich.console import Console
from rich.table import Table

from goodput import schemas, subjects
from goodput.bus import Bus, BusSettings, EmbeddedNats

NS = 1e9
TIMEOUT_S = 2.0
POLL_S = 0.25
JOB = "cp"


def _simulate(url: str, nodes: int, commands: multiprocessing.Queue, stopped_at) -> None:
    """Publisher process: every node beats once a second, spread evenly over the second."""

    async def main() -> None:
        bus = await Bus.connect(BusSettings(url=url), name="goodput-bench-simulated-nodes")
        silent: set[int] = set()
        beats = [
            schemas.Heartbeat(job=JOB, node=f"sim-{n}", rank=n, pid=100_000 + n, step=0)
            for n in range(nodes)
        ]
        slices = 100  # publish a hundredth of the nodes every 10 ms
        per_slice = max(nodes // slices, 1)
        step = 0
        while True:
            second_start = time.monotonic()
            step += 1
            for index in range(slices):
                while not commands.empty():
                    action, rank = commands.get_nowait()
                    if action == "quit":
                        await bus.close()
                        return
                    if action == "silence":
                        silent.add(rank)
                        stopped_at.value = time.time_ns()
                    else:
                        silent.discard(rank)
                for n in range(index * per_slice, min((index + 1) * per_slice, nodes)):
                    if n not in silent:
                        beats[n].step = step
                        await bus.nc.publish(
                            subjects.heartbeat(JOB, beats[n].node, n), schemas.encode(beats[n])
                        )
                await asyncio.sleep(max(second_start + (index + 1) / slices - time.monotonic(), 0))

    asyncio.run(main())


async def _measure(url: str, sensor_pid: int, nodes: int, rounds: int, console: Console) -> dict:
    bus = await Bus.connect(BusSettings(url=url), name="goodput-bench-control-plane")
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
    context = multiprocessing.get_context("spawn")
    commands = context.Queue()
    stopped_at = context.Value("q", 0)
    simulator = context.Process(
        target=_simulate, args=(url, nodes, commands, stopped_at), daemon=True
    )
    simulator.start()
    sensor = psutil.Process(sensor_pid)
    await asyncio.sleep(4.0)  # every node seen at least once and learned
    cpu_before, wall_before = sensor.cpu_times(), time.monotonic()
    latencies: list[float] = []
    missed = 0
    for round_index in range(rounds):
        victim = (round_index * 7919) % nodes
        seen = len(signals)
        commands.put(("silence", victim))
        deadline = time.monotonic() + TIMEOUT_S + 2 * POLL_S + 1.0
        found = None
        while time.monotonic() < deadline + 5 and found is None:
            found = next((s for s in signals[seen:] if s.node == f"sim-{victim}"), None)
            await asyncio.sleep(0.02)
        if found is None:
            missed += 1
        else:
            # the fault is the first beat that did not come: a second after the last one
            latencies.append((found.ts - stopped_at.value) / NS)
        commands.put(("resume", victim))
        await bus.emit(
            schemas.RankStarted(
                job=JOB,
                node=f"sim-{victim}",
                rank=victim,
                local_rank=0,
                world_size=nodes,
                pid=100_000 + victim,
                attempt=round_index + 2,
            )
        )
        console.print(
            f"  {nodes} nodes, round {round_index + 1}/{rounds}: "
            + (f"{latencies[-1]:.2f} s" if found else "not detected")
        )
        await asyncio.sleep(1.5)
    cpu_after, wall_after = sensor.cpu_times(), time.monotonic()
    commands.put(("quit", 0))
    simulator.join(10)
    await bus.close()
    victims = {f"sim-{(i * 7919) % nodes}" for i in range(rounds)}
    false_positives = sum(1 for s in signals if s.node not in victims)
    cpu_s = (cpu_after.user + cpu_after.system) - (cpu_before.user + cpu_before.system)
    limit = TIMEOUT_S + 2 * POLL_S + 1.0
    return {
        "nodes": nodes,
        "p50_detect_s": round(statistics.median(latencies), 3) if latencies else None,
        "p99_detect_s": round(_percentile(latencies, 0.99), 3) if latencies else None,
        "missed": missed,
        "false_positives": false_positives,
        "kept_up": missed == 0 and false_positives == 0 and max(latencies, default=99) <= limit,
        "sensor_cpu_pct": round(100 * cpu_s / (wall_after - wall_before), 1),
        "heartbeats_per_s": nodes,
    }


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def _start_sensor(url: str, state_dir: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "goodput_services.sensor",
            "--job",
            JOB,
            "--nats-url",
            url,
            "--state-dir",
            str(state_dir),
            "--set",
            f"thresholds={{heartbeat_timeout_s={TIMEOUT_S},heartbeat_polling_period_s={POLL_S},"
            "heartbeat_safety_factor=1.0,first_heartbeat_timeout_s=5.0}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=open(state_dir / "sensor.log", "ab"),
    )


def run(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    sizes = [int(n) for n in str(args.nodes).split(",")]
    sweep = []
    for nodes in sizes:
        with tempfile.TemporaryDirectory(prefix="goodput-bench-cp-") as tmp:
            state_dir = Path(tmp)
            with EmbeddedNats(state_dir) as server:
                asyncio.run(_provision(server.url))
                sensor = _start_sensor(server.url, state_dir)
                try:
                    time.sleep(2.0)
                    sweep.append(
                        asyncio.run(_measure(server.url, sensor.pid, nodes, args.rounds, console))
                    )
                finally:
                    sensor.terminate()
                    sensor.wait(30)
    kept = [r["nodes"] for r in sweep if r["kept_up"]]
    result = {
        **sweep[-1],
        "sweep": sweep,
        "max_nodes_kept_up": max(kept) if kept else 0,
        "heartbeat_timeout_s": TIMEOUT_S,
        "heartbeat_polling_period_s": POLL_S,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    table = Table(title="one sensor, nodes heartbeating at 1 Hz")
    for column in ("nodes", "p50 detect s", "p99 detect s", "sensor CPU %", "kept up"):
        table.add_column(column, justify="right")
    for r in sweep:
        table.add_row(
            str(r["nodes"]),
            str(r["p50_detect_s"]),
            str(r["p99_detect_s"]),
            str(r["sensor_cpu_pct"]),
            "yes" if r["kept_up"] else "no",
        )
    Console().print(table)
    return 0


async def _provision(url: str) -> None:
    bus = await Bus.connect(BusSettings(url=url), name="goodput-bench")
    await bus.provision()
    await bus.close()


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "control-plane",
        help="detection latency and sensor CPU with thousands of simulated nodes",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--nodes",
        default="1024,4096,10000",
        help="simulated node count(s), comma-separated (default 1024,4096,10000)",
    )
    parser.add_argument("--rounds", type=int, default=8, help="silent nodes per size (default 8)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=run)
