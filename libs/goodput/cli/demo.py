"""`goodput demo`: the stack on embedded defaults, end to end.

This first version starts the whole supervisor stack, checks that a command travels through
the bus to a service and comes back as an action result, reports every service's health, and
stops the stack again.
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

from goodput import schemas
from goodput.bus import Bus, BusSettings
from goodput.cli.stack import service_report, start_stack, stop_stack, wait_healthy
from goodput.config import add_bus_arguments


async def _command_round_trip(settings: BusSettings, job: str) -> dict:
    """Send a real command to the sensor and wait for its action result."""
    bus = await Bus.connect(settings, name="goodput-demo")
    try:
        inbox = await bus.js.subscribe(f"gp.{job}.evt.action_result", ordered_consumer=True)
        command = schemas.SetThresholds(job=job, values={"heartbeat_timeout_s": 4.0})
        started = time.monotonic()
        await bus.send_command("sensor", command)
        while True:
            message = await inbox.next_msg(timeout=20)
            result = schemas.decode_event(message.data)
            if isinstance(result, schemas.ActionResult) and result.command_id == command.command_id:
                return {
                    "command": "set_thresholds → sensor",
                    "ok": result.ok,
                    "round_trip_s": round(time.monotonic() - started, 3),
                }
    finally:
        await bus.close()


def run(args: argparse.Namespace) -> int:
    console = Console(stderr=True)
    with tempfile.TemporaryDirectory(prefix="goodput-demo-") as tmp:
        state_dir = Path(args.state_dir or tmp).resolve()
        started = time.monotonic()
        try:
            stack, settings = start_stack(args, state_dir, args.job, args.nodes, console)
            report = asyncio.run(wait_healthy(settings, stack.job, stack.services, 20, console))
            round_trip = asyncio.run(_command_round_trip(settings, stack.job))
            report = asyncio.run(service_report(settings, stack.job, stack.services))
        finally:
            stop_stack(state_dir)
    healthy = all(s["healthy"] for s in report) and round_trip["ok"]
    result = {
        "healthy": healthy,
        "services": report,
        "command_round_trip": round_trip,
        "elapsed_s": round(time.monotonic() - started, 2),
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        table = Table(title="goodput demo — the supervisor stack")
        table.add_column("service")
        table.add_column("healthy")
        for entry in report:
            table.add_row(entry["name"], "[green]yes[/]" if entry["healthy"] else "[red]no[/]")
        Console().print(table)
        console.print(
            f"command round trip through JetStream: {round_trip['round_trip_s']} s, "
            f"ok={round_trip['ok']}; whole demo {result['elapsed_s']} s"
        )
    return 0 if healthy else 1


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="the main job on embedded defaults",
        description="Start embedded NATS and every service, send a command through the bus, "
        "report health, and stop everything.",
    )
    parser.add_argument("--state-dir", help="keep the demo's state here (default: a temp dir)")
    parser.add_argument("--job", default="demo", help="job name (default: demo)")
    parser.add_argument("--nodes", type=int, default=2, help="local nodes (default: 2)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    add_bus_arguments(parser)
    parser.set_defaults(func=run)
