"""`goodput bench store`: the bytes each message takes in JetStream, and the stores' sizing.

For a scale (``--scale nodes=2048,ranks_per_node=8``, the syntax of ``GOODPUT_STORE_SCALE``)
it prints, per event and command kind, the size the sizing formula counts
(:mod:`goodput.bus.store_sizing`) next to the size a real embedded nats-server accounts for
the same message published as goodput publishes it (a ``Nats-Msg-Id`` and a ``traceparent``),
then the events' growth per second and per day, every stream's and bucket's limit, and the
server store that holds them all (the ``max_file_store`` line for nats.conf). Cheap: a few
hundred messages through one server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from goodput import schemas, subjects
from goodput.bus import Bus, BusSettings, EmbeddedNats
from goodput.bus.message_sizes import command_bytes, event_bytes, sample_commands, sample_events
from goodput.bus.store_sizing import (
    DEFAULT_SCALE,
    MIB,
    StoreScale,
    StoreScaleError,
    parse_scale,
    scale_from_env,
    scale_to_env,
    store_limits,
)
from goodput.state_dir import StateDir

#: copies of each message published to measure its stored size
COPIES = 20
#: a W3C traceparent as goodput's tracing writes it (55 characters)
TRACEPARENT = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"


async def _stored_size(bus: Bus, stream: str, subject: str, message: schemas.Message) -> float:
    """What ``COPIES`` publications of ``message`` added to ``stream``, per message."""
    before = (await bus.js.stream_info(stream)).state.bytes
    for _ in range(COPIES):
        await bus.publish(
            subject, message, msg_id=schemas.new_id(), headers={"traceparent": TRACEPARENT}
        )
    return ((await bus.js.stream_info(stream)).state.bytes - before) / COPIES


async def measure(scale: StoreScale, state_dir: Path) -> dict:
    """Formula and server figures of every sampled kind at ``scale``, and the limits."""
    limits = store_limits(scale)
    kinds: dict[str, dict[str, float]] = {}
    with EmbeddedNats(StateDir(state_dir), store_bytes=limits.server_bytes) as server:
        bus = await Bus.connect(BusSettings(url=server.url), name="goodput-bench-store")
        try:
            await bus.provision(scale=scale)
            for kind, event in sample_events(scale.widths).items():
                measured = await _stored_size(
                    bus, subjects.EVENTS_STREAM, subjects.event_for(event), event
                )
                kinds[f"event {kind}"] = {"formula": event_bytes(event), "server": measured}
            for kind, (target, command) in sample_commands(scale.widths).items():
                subject = subjects.command(command.job, target)
                measured = await _stored_size(bus, subjects.COMMANDS_STREAM, subject, command)
                kinds[f"command {kind}"] = {
                    "formula": command_bytes(target, command),
                    "server": measured,
                }
        finally:
            await bus.close()
    return {
        "scale": scale_to_env(scale),
        "messages": kinds,
        "events_bytes_per_s": limits.events_per_s_bytes,
        "events_bytes_per_day": limits.events_per_s_bytes * 86_400,
        "streams": limits.streams,
        "buckets": limits.buckets,
        "server_bytes": limits.server_bytes,
        "nats_conf": f"max_file_store: {limits.server_bytes // MIB}M",
    }


def _show(result: dict) -> None:
    console = Console()
    table = Table(title="stored bytes per message (formula vs nats-server)")
    for column in ("message", "formula", "server"):
        table.add_column(column, justify="left" if column == "message" else "right")
    for kind, sizes in result["messages"].items():
        table.add_row(kind, f"{sizes['formula']:,}", f"{sizes['server']:,.0f}")
    console.print(table)
    limits = Table(title="limits")
    limits.add_column("stream / bucket")
    limits.add_column("MiB", justify="right")
    for name, size in {**result["streams"], **result["buckets"]}.items():
        limits.add_row(name, f"{size / MIB:,.0f}")
    limits.add_row("server store (each server)", f"{result['server_bytes'] / MIB:,.0f}")
    console.print(limits)
    per_day = result["events_bytes_per_day"] / 1e9
    console.print(
        f"events: {result['events_bytes_per_s'] / 1e6:,.2f} MB/s, {per_day:,.1f} GB a day; "
        f"nats.conf jetstream {{ {result['nats_conf']} }}; "
        + " ".join(f"{key}={value}" for key, value in result["scale"].items())
    )


def run(args: argparse.Namespace) -> int:
    try:
        scale = parse_scale(args.scale, "--scale") if args.scale else None
    except StoreScaleError as exc:
        Console(stderr=True).print(f"goodput bench store: {exc}", soft_wrap=True)
        return 2
    scale = scale or scale_from_env() or DEFAULT_SCALE
    with tempfile.TemporaryDirectory(prefix="goodput-bench-store-") as tmp:
        result = asyncio.run(measure(scale, Path(tmp)))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _show(result)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "store",
        help="bytes per message in JetStream, and the stream, bucket and server store limits",
        description="Measure what each goodput message takes in a real nats-server's store "
        "and print the byte limits the bus is sized with at a scale (store_sizing).",
    )
    parser.add_argument(
        "--scale",
        help="the job to size for, as GOODPUT_STORE_SCALE: nodes=2048,ranks_per_node=8,"
        "step_s=1,checkpoint_s=600,host_report_s=2,restarts_per_hour=1,keep_h=24 "
        "(default: $GOODPUT_STORE_SCALE, else 16 nodes of 8 ranks)",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=run)
