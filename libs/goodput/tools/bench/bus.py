"""`goodput bench bus`: events/s through JetStream (the product's path) vs raw core NATS.

Both paths carry the same 1 KiB step events through the same embedded server; the publisher
is its own process (as trainers are) and this process consumes (as the sensor does). The
figure is the sustained rate at the consumer: events between the first and last arrival.

``--cluster N`` measures the same against an embedded cluster of N servers (R3 streams: every
publish is acknowledged only once a quorum stored it) in the same run, alternating with the
single server so that both see the same machine load; the ratio of each repeat and their
range say what the replication costs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from goodput import schemas, subjects
from goodput.bus import Bus, BusSettings, DurableConsumer, EmbeddedNats
from goodput.bus.cluster import EmbeddedCluster, cluster_size
from goodput.state_dir import StateDir

PAYLOAD_BYTES = 1024


def _events(job: str, count: int) -> list[schemas.StepDone]:
    """Step events padded to ~1 KiB on the wire (a long node name stands in for real labels)."""
    base = schemas.StepDone(
        job=job, node="", rank=0, step=0, step_time_s=0.1, tokens=4096, loss=2.5
    )
    padding = PAYLOAD_BYTES - len(schemas.encode(base))
    node = "n" * max(padding, 1)
    return [
        schemas.StepDone(
            job=job, node=node, rank=i % 1024, step=i, step_time_s=0.1, tokens=4096, loss=2.5
        )
        for i in range(count)
    ]


def _publish_in_child(url: str, job: str, count: int, path: str) -> None:
    """Publisher process: trainers and the sensor are separate processes in a real job too."""

    async def publish() -> None:
        bus = await Bus.connect(BusSettings(url=url), name=f"goodput-bench-{path}")
        events = _events(job, count)
        if path == "jetstream":
            await bus.emit_many(events)
        else:
            subject = _core_subject(job)
            for event in events:
                await bus.nc.publish(subject, schemas.encode(event))
        await bus.close()

    asyncio.run(publish())


def _core_subject(job: str) -> str:
    return f"gp.{job}.bench.core"


class _Rate:
    """Sustained rate: events between the first and the last arrival, over that time."""

    def __init__(self, expected: int):
        self.expected = expected
        self.count = 0
        self.first = 0.0
        self.last = 0.0
        self.done = asyncio.Event()

    def tick(self) -> None:
        now = time.perf_counter()
        if self.count == 0:
            self.first = now
        self.count += 1
        self.last = now
        if self.count >= self.expected:
            self.done.set()

    @property
    def per_s(self) -> float:
        return (self.count - 1) / max(self.last - self.first, 1e-9)


def _start_publisher(
    url: str, job: str, count: int, path: str
) -> multiprocessing.process.BaseProcess:
    process = multiprocessing.get_context("spawn").Process(
        target=_publish_in_child, args=(url, job, count, path), daemon=True
    )
    process.start()
    return process


async def _jetstream(bus: Bus, url: str, job: str, count: int) -> float:
    rate = _Rate(count)

    async def handle(event: schemas.Event, msg: object) -> None:
        rate.tick()

    consumer = DurableConsumer(
        bus,
        stream=subjects.EVENTS_STREAM,
        durable=f"{job}-bench",
        subject=subjects.events_of_kind(job, schemas.kind_of(schemas.StepDone)),
        decode=schemas.decode_event,
        handler=handle,
        service="bench",
        job=job,
        batch=500,
    )
    consuming = asyncio.create_task(consumer.run())
    publisher = _start_publisher(url, job, count, "jetstream")
    await rate.done.wait()
    consumer.stop()
    await consuming
    publisher.join()
    return rate.per_s


async def _core(bus: Bus, url: str, job: str, count: int) -> float:
    rate = _Rate(count)

    async def handle(msg: object) -> None:
        rate.tick()

    subscription = await bus.nc.subscribe(
        _core_subject(job), cb=handle, pending_msgs_limit=count + 1
    )
    await bus.nc.flush()
    publisher = _start_publisher(url, job, count, "core")
    await rate.done.wait()
    await subscription.unsubscribe()
    publisher.join()
    return rate.per_s


async def _paths(url: str, count: int, *, core_too: bool = True) -> tuple[float, float, int]:
    """JetStream (and core, or 0) events/s through the server(s) at ``url``, and the stream's
    replicas."""
    bus = await Bus.connect(BusSettings(url=url), name="goodput-bench")
    try:
        await bus.provision()
        job = f"bench{time.time_ns() % 10**9}"
        core = await _core(bus, url, job, count) if core_too else 0.0
        jetstream = await _jetstream(bus, url, job, count)
        return jetstream, core, bus.replicas
    finally:
        await bus.close()


async def measure(count: int, url: str | None) -> dict:
    with tempfile.TemporaryDirectory(prefix="goodput-bench-bus-") as tmp:
        server = None if url else EmbeddedNats(StateDir(Path(tmp)))
        if server is not None:
            server.start()
            url = server.url
        assert url is not None
        try:
            jetstream, core, _ = await _paths(url, count)
        finally:
            if server is not None:
                server.stop()
    return {
        "events": count,
        "payload_bytes": len(schemas.encode(_events("bench", 1)[0])),
        "jetstream_events_per_s": round(jetstream),
        "core_events_per_s": round(core),
        "jetstream_vs_core": round(jetstream / core, 3),
        "target_jetstream_events_per_s": 20000,
    }


async def measure_cluster(count: int, size: int, repeats: int) -> dict:
    """JetStream events/s on one server vs a cluster of ``size`` (R3), alternating, each a
    fresh embedded server or cluster, ``repeats`` times."""
    single: list[float] = []
    clustered: list[float] = []
    replicas = 0
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="goodput-bench-bus-") as tmp:
            with EmbeddedNats(StateDir(Path(tmp) / "single")) as server:
                single.append((await _paths(server.url, count, core_too=False))[0])
            with EmbeddedCluster(StateDir(Path(tmp) / "cluster"), size) as cluster:
                rate, _, replicas = await _paths(cluster.url, count, core_too=False)
                clustered.append(rate)
    ratios = [c / s for c, s in zip(clustered, single, strict=True)]
    return {
        "events": count,
        "repeats": repeats,
        "cluster_servers": size,
        "cluster_replicas": replicas,
        "single_events_per_s": [round(r) for r in single],
        "cluster_events_per_s": [round(r) for r in clustered],
        "cluster_vs_single": [round(r, 3) for r in ratios],
        "cluster_vs_single_range": [round(min(ratios), 3), round(max(ratios), 3)],
    }


def run(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    if args.cluster > 1:
        with console.status(
            f"JetStream on one server vs a cluster of {args.cluster}, {args.repeats}x…"
        ):
            result = asyncio.run(measure_cluster(args.events, args.cluster, args.repeats))
        if args.json:
            print(json.dumps(result, indent=2))
            return 0
        table = Table(title=f"JetStream 1 KiB events/s: one server vs a cluster of {args.cluster}")
        for column in ("repeat", "one server (R1)", f"cluster (R{result['cluster_replicas']})"):
            table.add_column(column, justify="right")
        table.add_column("cluster / one", justify="right")
        for i, (one, many, ratio) in enumerate(
            zip(
                result["single_events_per_s"],
                result["cluster_events_per_s"],
                result["cluster_vs_single"],
                strict=True,
            )
        ):
            table.add_row(str(i + 1), f"{one:,}", f"{many:,}", f"{ratio:.2f}")
        Console().print(table)
        low, high = result["cluster_vs_single_range"]
        Console().print(f"cluster / one server: {low:.2f} to {high:.2f}")
        return 0
    with console.status(f"publishing and consuming {args.events} events on each path…"):
        result = asyncio.run(measure(args.events, args.nats_url))
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    table = Table(title="bus throughput (1 KiB events, publish + consume)")
    table.add_column("path")
    table.add_column("events/s", justify="right")
    table.add_row(
        "JetStream (stored, acked, durable consumer)", f"{result['jetstream_events_per_s']:,}"
    )
    table.add_row("core NATS (not stored)", f"{result['core_events_per_s']:,}")
    Console().print(table)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bus",
        help="JetStream vs core NATS throughput of 1 KiB events",
        description="Publish+consume of 1 KiB events through JetStream (stored, deduplicated, "
        "acked by a durable consumer) vs raw core-NATS publish, in the same run.",
    )
    parser.add_argument(
        "--events", type=int, default=100_000, help="events per path (default 100000)"
    )
    parser.add_argument("--nats-url", help="measure an existing server instead of an embedded one")
    parser.add_argument(
        "--cluster",
        type=cluster_size,
        default=1,
        metavar="N",
        help="also measure an embedded cluster of N servers (R3) against one server, same run",
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="with --cluster: alternations (default 3)"
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=run)
