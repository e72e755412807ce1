"""`goodput bench command-links`: what N ranks (re)starting at once cost the bus to start
receiving trainer commands, by an ordered JetStream consumer per rank (the link before issue
36) and by a core subscription plus one direct lookup (``shim.command_feed``).

A real nats-server (with its HTTP monitoring) stores one trainer command; then N simulated
links, spread over ``--processes`` worker processes, each on a connection of its own as a
rank's link is, connect together and subscribe. A link is *ready* once the stored command
reached it (by the consumer's replay, or by the lookup). Reported per mode, each on a fresh
server: seconds from the start until every link connected, and until every link was ready;
the server's CPU seconds over that span and its memory after (``/varz`` ``mem``); and the
consumers on GP_CMDS while the links live.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import tempfile
import time
from multiprocessing.synchronize import Event
from pathlib import Path

import psutil
from nats.js.api import ConsumerConfig, DeliverPolicy
from rich.console import Console
from rich.table import Table

from goodput import schemas, subjects
from goodput.bus import Bus, BusSettings, EmbeddedNats
from goodput.bus.embedded import free_port
from goodput.shim.command_feed import CommandFeed
from goodput.state_dir import StateDir
from goodput.tools.bench.arguments import positive_int, positive_ints
from goodput.tools.bench.control_plane_measure import varz

JOB = "bench-command-links"
MODES = ("consumer", "core")
#: a connection storm on a small host takes long: the links wait for the server this long
CONNECT_FOR_S = 600.0


async def _consumer_link(bus: Bus, since_ns: int, ready: asyncio.Event) -> None:
    """The link before issue 36: an ordered consumer from the launch."""

    async def on_message(_msg: object) -> None:
        ready.set()

    start = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(since_ns / 1e9))
    await bus.js.subscribe(
        subjects.command(JOB, subjects.TRAINER),
        stream=subjects.COMMANDS_STREAM,
        cb=on_message,
        ordered_consumer=True,
        config=ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_TIME,
            opt_start_time=f"{start}.{since_ns % 10**9:09d}Z",  # type: ignore[arg-type]  # nats-py annotates a datetime, passes a str as is: a datetime drops the ns
        ),
    )


async def _core_link(bus: Bus, since_ns: int, ready: asyncio.Event) -> None:
    """Today's link: a core subscription and one lookup (``CommandFeed``)."""

    async def reject(subject: str, reason: str, payload: bytes) -> None:
        raise RuntimeError(f"{subject}: {reason}")

    feed = CommandFeed(
        bus, job=JOB, since_ns=since_ns, on_command=lambda _c: ready.set(), reject=reject
    )
    await feed.start()


async def _links(url: str, mode: str, count: int, since_ns: int, go: Event, leave: Event, out):
    await asyncio.to_thread(go.wait)
    began = time.time()

    async def link(n: int) -> tuple[Bus, float, float]:
        bus = await Bus.connect(
            BusSettings(url=url), name=f"bench-link-{n}", initial_timeout_s=CONNECT_FOR_S
        )
        connected = time.time()
        ready = asyncio.Event()
        subscribe = _consumer_link if mode == "consumer" else _core_link
        await subscribe(bus, since_ns, ready)
        await ready.wait()
        return bus, connected, time.time()

    outcomes = await asyncio.gather(*(link(n) for n in range(count)), return_exceptions=True)
    done = [outcome for outcome in outcomes if not isinstance(outcome, BaseException)]
    refused = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
    if refused:  # the server refused some links (its consumer limit): said, not hung on
        out.put((began, f"{len(refused)} of {count} links failed: {refused[0]}", 0.0))
    else:
        out.put((began, max(c for _, c, _ in done), max(r for _, _, r in done)))
    await asyncio.to_thread(leave.wait)
    for bus, _, _ in done:
        await bus.close()


def _worker(url: str, mode: str, count: int, since_ns: int, go: Event, leave: Event, out) -> None:
    asyncio.run(_links(url, mode, count, since_ns, go, leave, out))


async def _consumers(url: str) -> int:
    bus = await Bus.connect(BusSettings(url=url), name="bench-observer")
    try:
        return (await bus.js.stream_info(subjects.COMMANDS_STREAM)).state.consumer_count
    finally:
        await bus.close()


async def _store_a_command(url: str) -> int:
    """Provision, store one trainer command; returns the launch time the links read from."""
    bus = await Bus.connect(BusSettings(url=url), name="bench-sender")
    try:
        await bus.provision()
        since_ns = schemas.now_ns()
        await bus.send_command(subjects.TRAINER, schemas.CheckpointNow(job=JOB))
        return since_ns
    finally:
        await bus.close()


def measure(links: int, processes: int, mode: str) -> dict:
    """One mode at one size, on a fresh server."""
    monitor_port = free_port()
    with tempfile.TemporaryDirectory(prefix="goodput-bench-links-") as state:
        server = EmbeddedNats(StateDir(Path(state)), monitor_port=monitor_port)
        server.start()
        try:
            since_ns = asyncio.run(_store_a_command(server.url))
            context = mp.get_context("spawn")
            go, leave, out = context.Event(), context.Event(), context.Queue()
            shares = [links // processes + (p < links % processes) for p in range(processes)]
            workers = [
                context.Process(
                    target=_worker, args=(server.url, mode, share, since_ns, go, leave, out)
                )
                for share in shares
                if share
            ]
            for worker in workers:
                worker.start()
            assert server.process is not None
            process = psutil.Process(server.process.pid)
            cpu_before = sum(process.cpu_times()[:2])
            go.set()
            ends = [out.get() for _ in workers]
            cpu_s = sum(process.cpu_times()[:2]) - cpu_before
            began = min(b for b, _, _ in ends)
            failed = [c for _, c, _ in ends if isinstance(c, str)]
            if failed:
                leave.set()
                for worker in workers:
                    worker.join(120)
                return {"mode": mode, "links": links, "failed": "; ".join(failed)}
            row = {
                "mode": mode,
                "links": links,
                "connected_s": round(max(c for _, c, _ in ends) - began, 2),
                "ready_s": round(max(r for _, _, r in ends) - began, 2),
                "server_cpu_s": round(cpu_s, 2),
                "server_mem_mib": round(varz(monitor_port)["mem"] / 2**20, 1),
                "consumers": asyncio.run(_consumers(server.url)),
            }
            leave.set()
            for worker in workers:
                worker.join(120)
            return row
        finally:
            server.stop()


def run(args: argparse.Namespace) -> int:
    rows = [measure(n, args.processes, mode) for n in args.links for mode in args.modes]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    table = Table(title="trainer-command links (re)starting together")
    columns = list(dict.fromkeys(column for row in rows for column in row))
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*(str(row.get(column, "")) for column in columns))
    Console().print(table)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "command-links",
        help="ranks subscribing to trainer commands: a consumer each vs core + one lookup",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--links", type=positive_ints, default=[2000, 8000], help="link counts (default 2000,8000)"
    )
    parser.add_argument(
        "--processes", type=positive_int, default=4, help="worker processes (default 4)"
    )
    parser.add_argument(
        "--modes",
        type=lambda text: [m for m in text.split(",") if m in MODES],
        default=list(MODES),
        help="consumer,core (default both)",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=run)
