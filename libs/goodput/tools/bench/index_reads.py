"""`goodput bench index-reads`: one replicator's checkpoint-index bytes read per second, by a
complete read every poll (the replicator before issue 36) and by the index follower.

A real nats-server holds the index of N simulated nodes (:mod:`.index_fleet`, which
`bench control-plane` shares), each with the copy records the store sizing counts
(``INDEX_COPIES_PER_NODE``, each listing ``ranks_per_node + 2`` files).
While a writer changes one node per second (a new step's copy on each tier, the oldest
step's withdrawn) and every node rewrites its address record every ``--announce-s`` (by
default the replicators' backstop refresh, a third of the node TTL; ``--announce-s 1`` is
the replicators before announcing on change, once per ``poll_s``), a reader on a connection of its own takes a snapshot
every ``--poll-s``: first by a complete read (``CheckpointIndex.snapshot``, then a pause of
a poll, as the sync loop ran), then from an ``IndexFollower``. The figure is the payload
bytes that reader's connection received in the window, per second (the follower's one
complete read at start-up is reported apart); the two alternate ``--repeats`` times under
the same writers, and each repeat's ratio is reported. A complete read that takes longer
than a poll caps the first figure (the reader is busy reading: its time is shown too). The
follower's bytes are also split by record: copies (what checkpoints change) and node
announcements, which every reader receives from every node that writes one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from goodput.bus import Bus, BusSettings, EmbeddedNats
from goodput.bus.store_sizing import StoreScale, store_limits
from goodput.checkpoint.index.announcement import refresh_s
from goodput.checkpoint.index.follower import IndexFollower
from goodput.checkpoint.index.index import DEFAULT_NODE_TTL_S, CheckpointIndex
from goodput.state_dir import StateDir
from goodput.tools.bench.arguments import add_fleet_nodes, positive_int
from goodput.tools.bench.index_fleet import Writers

JOB = "bench-index-read"


def _nodes(count: int) -> list[str]:
    return [f"node-{n:05d}" for n in range(count)]


async def _received(bus: Bus) -> int:
    await bus.nc.flush()
    return bus.nc.stats["in_bytes"]


async def _full_reads(url: str, window_s: float, poll_s: float) -> dict:
    """The sync loop before issue 36: a complete read, then a pause of a poll."""
    bus = await Bus.connect(BusSettings(url=url), name="goodput-bench-index-full")
    try:
        index = CheckpointIndex(bus, JOB)
        start_bytes, started = await _received(bus), time.monotonic()
        reads, read_s = 0, 0.0
        while time.monotonic() - started < window_s:
            begun = time.monotonic()
            await index.snapshot()
            read_s += time.monotonic() - begun
            reads += 1
            await asyncio.sleep(poll_s)
        elapsed = time.monotonic() - started
        return {
            "bytes_per_s": (await _received(bus) - start_bytes) / elapsed,
            "reads": reads,
            "read_s": read_s / reads,
        }
    finally:
        await bus.close()


async def _followed(url: str, window_s: float, poll_s: float) -> dict:
    """The follower: one complete read, then a snapshot from memory every poll."""
    bus = await Bus.connect(BusSettings(url=url), name="goodput-bench-index-follow")
    try:
        async with IndexFollower(bus, JOB).running() as follower:
            begun = time.monotonic()
            await follower.snapshot(timeout_s=120)
            initial_bytes, initial_s = await _received(bus), time.monotonic() - begun
            started = time.monotonic()
            while time.monotonic() - started < window_s:
                await follower.snapshot()
                await asyncio.sleep(poll_s)
            elapsed = time.monotonic() - started
            counts = follower.counts
            return {
                "bytes_per_s": (await _received(bus) - initial_bytes) / elapsed,
                "copy_bytes_per_s": counts.bytes["copy"] / elapsed,
                "node_bytes_per_s": counts.bytes["node"] / elapsed,
                "messages_per_s": counts.messages.total() / elapsed,
                "initial_read_bytes": initial_bytes,
                "initial_read_s": initial_s,
                "complete_reads": follower.counts.reads,
            }
    finally:
        await bus.close()


async def measure(nodes: int, args: argparse.Namespace, state_dir: Path, console: Console) -> dict:
    """Before and after, alternating ``args.repeats`` times, at ``nodes`` simulated nodes."""
    scale = StoreScale(nodes=nodes, ranks_per_node=args.ranks_per_node)
    with EmbeddedNats(StateDir(state_dir), store_bytes=store_limits(scale).server_bytes) as server:
        bus = await Bus.connect(BusSettings(url=server.url), name="goodput-bench-index-writers")
        try:
            await bus.provision(scale=scale)
            writers = Writers(bus, JOB, _nodes(nodes), args.ranks_per_node, args.announce_s)
            records = await writers.fill()
            console.print(f"  {nodes} nodes: {records:,} index records written")
            loops = [asyncio.create_task(writers.churn()), asyncio.create_task(writers.announce())]
            before, after = [], []
            try:
                for repeat in range(args.repeats):
                    before.append(await _full_reads(server.url, args.seconds, args.poll_s))
                    after.append(await _followed(server.url, args.seconds, args.poll_s))
                    console.print(
                        f"  {nodes} nodes, repeat {repeat + 1}/{args.repeats}: complete reads "
                        f"{before[-1]['bytes_per_s'] / 1e6:,.2f} MB/s, follower "
                        f"{after[-1]['bytes_per_s'] / 1e3:,.1f} kB/s"
                    )
            finally:
                for loop in loops:
                    loop.cancel()
                await asyncio.gather(*loops, return_exceptions=True)
        finally:
            await bus.close()
    ratios = [
        b["bytes_per_s"] / max(a["bytes_per_s"], 1.0) for b, a in zip(before, after, strict=True)
    ]
    return {
        "nodes": nodes,
        "records": records,
        "complete_read_bytes": after[0]["initial_read_bytes"],
        "complete_read_s": [round(b["read_s"], 3) for b in before],
        "before_bytes_per_s": [round(b["bytes_per_s"]) for b in before],
        "after_bytes_per_s": [round(a["bytes_per_s"]) for a in after],
        "after_copy_bytes_per_s": [round(a["copy_bytes_per_s"]) for a in after],
        "after_announcement_bytes_per_s": [round(a["node_bytes_per_s"]) for a in after],
        "after_messages_per_s": [round(a["messages_per_s"], 1) for a in after],
        "follower_complete_reads": [a["complete_reads"] for a in after],
        "follower_complete_read_s": [round(a["initial_read_s"], 3) for a in after],
        "before_vs_after": [round(r, 1) for r in ratios],
    }


def _span(values: list[float], scale: float, digits: int) -> str:
    low, high = min(values) / scale, max(values) / scale
    return f"{low:,.{digits}f}" if low == high else f"{low:,.{digits}f}-{high:,.{digits}f}"


def _show(result: dict) -> None:
    table = Table(
        title="one replicator's index bytes read per second (copies: the follower's copy records)"
    )
    columns = (
        "nodes",
        "records",
        "read MB",
        "read s",
        "before MB/s",
        "after kB/s",
        "copies kB/s",
        "announce kB/s",
        "ratio",
    )
    for column in columns:
        table.add_column(column, justify="right")
    for r in result["sweep"]:
        table.add_row(
            str(r["nodes"]),
            f"{r['records']:,}",
            f"{r['complete_read_bytes'] / 1e6:,.1f}",
            _span(r["complete_read_s"], 1, 2),
            _span(r["before_bytes_per_s"], 1e6, 2),
            _span(r["after_bytes_per_s"], 1e3, 1),
            _span(r["after_copy_bytes_per_s"], 1e3, 2),
            _span(r["after_announcement_bytes_per_s"], 1e3, 2),
            _span(r["before_vs_after"], 1, 0),
        )
    Console().print(table)


def run(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    sweep = []
    for nodes in args.nodes:
        with tempfile.TemporaryDirectory(prefix="goodput-bench-index-") as tmp:
            sweep.append(asyncio.run(measure(nodes, args, Path(tmp), console)))
    result = {
        "sweep": sweep,
        "poll_s": args.poll_s,
        "announce_s": args.announce_s,
        "seconds": args.seconds,
        "repeats": args.repeats,
        "ranks_per_node": args.ranks_per_node,
        "changes": "one node per second: a new step on 3 tiers, the oldest withdrawn",
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _show(result)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "index-reads",
        help="a replicator's index bytes read per second: a complete read per poll vs the follower",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_fleet_nodes(parser)
    parser.add_argument(
        "--ranks-per-node", type=positive_int, default=8, help="files per copy - 2 (default 8)"
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="each window (default 10)")
    parser.add_argument(
        "--repeats", type=positive_int, default=3, help="before/after alternations (default 3)"
    )
    parser.add_argument(
        "--poll-s", type=float, default=1.0, help="the replicator's poll_s (default 1)"
    )
    parser.add_argument(
        "--announce-s",
        type=float,
        default=refresh_s(DEFAULT_NODE_TTL_S),
        help="each node's announcement period: the replicators' refresh of an unchanged record"
        " (default %(default)g); 1: every poll, as before announcing on change; 0: none",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=run)
