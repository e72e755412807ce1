"""`goodput status`: the stack's service health and a view of the job, live or one snapshot.

Service health comes from the bus alone (every replica's record, :mod:`goodput.tools.stack.
health`), so any stack shows, whoever started it; a stack `goodput up` started here adds the
services it must have and the processes it knows have exited. The job view is a fold of the job's whole event history (read from the first stored event,
then followed), so opening it in the middle of a run shows what watching from the start
would have shown; heartbeats are live only (they are never stored).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from pathlib import Path

import msgspec
import nats.errors
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.text import Text

from goodput import schemas
from goodput.bus import Bus, BusSettingsError, BusUnavailableError
from goodput.config import (
    add_bus_arguments,
    add_state_dir_argument,
    bus_settings_from_args,
    job_name,
)
from goodput.measure.jobview.feed import JobFeed
from goodput.measure.jobview.model import JobModel
from goodput.measure.jobview.render import job_view, services_table
from goodput.tools.stack.health import ServicesHealth, services_health
from goodput.tools.stack.launcher import expected_slots, resolve_url, running_pids
from goodput.tools.stack.record import StackRecord, read_stack

#: service health is a KV read per service: refreshed less often than the job panels
SERVICES_EVERY_S = 2.0
#: in a one-shot view of a live job, listen this long so nodes show a heartbeat age
HEARTBEAT_LISTEN_S = 1.0


class _Target(msgspec.Struct, kw_only=True):
    job: str
    url: str
    stack: StackRecord | None
    #: the state directory the stack was looked for in (said in the view: which stack this is)
    state_dir: str


def _target(args: argparse.Namespace) -> _Target | str:
    """The job and bus to show, or why there is none."""
    state_dir = Path(args.state_dir).resolve()
    stack = read_stack(state_dir)
    job = args.job or (stack.job if stack else "")
    if not job:
        return (
            f"no stack in {state_dir} and no --job: start one with "
            f"`goodput up --state-dir {state_dir}` or name a job with --job"
        )
    url = args.nats_url or (stack.url if stack else "") or resolve_url(args, state_dir)[0]
    if not url:
        return f"no bus: no stack in {state_dir}; give --nats-url"
    return _Target(job=job, url=url, stack=stack, state_dir=str(state_dir))


def cmd_status(args: argparse.Namespace) -> int:
    target = _target(args)
    if isinstance(target, str):
        print(target, file=sys.stderr)
        return 1
    live = not (args.json or args.once) and sys.stdout.isatty()
    try:
        settings = msgspec.structs.replace(bus_settings_from_args(args), url=target.url)
        return asyncio.run(_live(settings, target, args) if live else _once(settings, target, args))
    except KeyboardInterrupt:
        return 0
    except (BusUnavailableError, BusSettingsError, nats.errors.Error) as exc:
        print(f"goodput status: cannot read the bus at {target.url}: {exc}", file=sys.stderr)
        return 1


async def _open(settings, target: _Target) -> tuple[Bus, JobModel, JobFeed]:
    bus = await Bus.connect(settings, name="goodput-status", initial_timeout_s=5)
    model = JobModel(target.job, known_nodes=target.stack.nodes if target.stack else [])
    return bus, model, await JobFeed(bus, model).start()


async def _services(bus: Bus, target: _Target) -> ServicesHealth:
    """Every replica the bus shows, and each service of a stack started here for this job."""
    stack = target.stack
    processes = stack.services if stack is not None and stack.job == target.job else []
    return await services_health(
        bus,
        target.job,
        time.time_ns(),
        expected=expected_slots(processes),
        running_pids=running_pids(processes),
    )


def _services_renderable(report: ServicesHealth, target: _Target) -> RenderableType:
    where = f", state {target.state_dir}" if target.stack is not None else ""
    title = f"goodput services — job {target.job}, bus {target.url}{where}"
    notes = [
        f"{report.superseded} stale record(s) of replaced processes not shown"
        if report.superseded
        else "",
        f"{report.ignored} record(s) ignored: key and content disagree" if report.ignored else "",
    ]
    if not report.entries:
        notes.insert(0, f"no service of job {target.job} reports on this bus")
    table = services_table(report.entries, title)
    table.caption = "; ".join(note for note in notes if note) or None
    return table


async def _once(settings, target: _Target, args: argparse.Namespace) -> int:
    """Catch up on the stream, then print one snapshot (text, or JSON with ``--json``)."""
    bus, model, feed = await _open(settings, target)
    try:
        complete = await feed.wait_caught_up(args.catch_up_timeout)
        if model.snapshot(time.time_ns()).state in schemas.LIVE_JOB_STATES:
            await asyncio.sleep(HEARTBEAT_LISTEN_S)
        report = await _services(bus, target)
        await feed.stop()
    finally:
        await bus.close()
    snapshot = model.snapshot(time.time_ns())
    healthy = report.healthy
    if args.json:
        document = {
            "job": target.job,
            "bus": target.url,
            "services": report.entries,
            "services_superseded": report.superseded,
            "services_ignored": report.ignored,
            "job_view": msgspec.to_builtins(snapshot),
            "caught_up": complete,
        }
        print(json.dumps(document, indent=2))
        return 0 if healthy else 1
    console = Console()
    console.print(job_view(snapshot, _services_renderable(report, target)))
    if not complete:
        console.print(f"[yellow]history not fully read within {args.catch_up_timeout:.0f} s[/]")
    return 0 if healthy else 1


async def _live(settings, target: _Target, args: argparse.Namespace) -> int:
    """Redraw the view every ``--refresh`` seconds until interrupted."""
    bus, model, feed = await _open(settings, target)
    console = Console()
    report = ServicesHealth(entries=[])
    services_at = 0.0
    try:
        with Live(console=console, auto_refresh=False, screen=False) as live:
            while True:
                if time.monotonic() - services_at >= SERVICES_EVERY_S:
                    with contextlib.suppress(Exception):  # an outage shows as stale records
                        report = await _services(bus, target)
                    services_at = time.monotonic()
                view = job_view(
                    model.snapshot(time.time_ns()), _services_renderable(report, target)
                )
                footer = Text(
                    ("" if feed.caught_up.is_set() else "reading history… ") + "Ctrl-C to quit",
                    style="dim",
                )
                live.update(Group(view, footer), refresh=True)
                await asyncio.sleep(args.refresh)
    except asyncio.CancelledError:
        pass
    finally:
        await feed.stop()
        await bus.close()
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    status = subparsers.add_parser(
        "status",
        help="live view of the job (nodes, ranks, step rate, checkpoints, signals, goodput) "
        "and the health of the stack's services",
        description=(
            "Show the health of every service of the job — every replica that reports on the "
            "bus, whoever started it, and each service of a stack `goodput up` started in "
            "--state-dir — and a view of the job: state and attempt, world size, nodes (active / spare / failed, ranks, "
            "pids, last heartbeat, host health), step and step rate, the last checkpoint per "
            "tier (host memory, local volume, peer, object store), recent signals, decisions "
            "and actions, and the running goodput. The job's events are read from the first "
            "one stored, then followed. On a terminal the view refreshes until Ctrl-C; "
            "otherwise, or with --once, one snapshot is printed; --json prints it as JSON. "
            "Exits 1 when a service is unhealthy, stale (its record no longer refreshed, and "
            "no newer replica replaced it) or, for a stack started here, missing."
        ),
    )
    add_state_dir_argument(status, "where the stack keeps its state")
    status.add_argument(
        "--job",
        type=job_name,
        default=None,
        help="job to show (default: the job of the stack in --state-dir)",
    )
    status.add_argument(
        "--once", action="store_true", help="read the history, print one snapshot and exit"
    )
    status.add_argument(
        "--json",
        action="store_true",
        help="print one snapshot as JSON (services, job_view) and exit",
    )
    status.add_argument(
        "--refresh",
        type=float,
        default=0.5,
        help="seconds between redraws of the live view (default: 0.5)",
    )
    status.add_argument(
        "--catch-up-timeout",
        type=float,
        default=30.0,
        help="seconds a snapshot waits for the job's stored events to be read (default: 30)",
    )
    add_bus_arguments(status)
    status.set_defaults(func=cmd_status)
