"""`goodput report`: the goodput of a job, from an event log or replayed from the bus."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Iterable
from pathlib import Path

import msgspec
import nats.errors
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from goodput import schemas
from goodput.bus import Bus, BusSettingsError, BusUnavailableError
from goodput.bus.job_events import HistoryRolledOffError
from goodput.config import (
    add_bus_arguments,
    add_state_dir_argument,
    bus_settings_from_args,
)
from goodput.measure.accounting import (
    EventLogError,
    GoodputReport,
    ResiliencyEvent,
    compute_goodput,
    iter_event_log,
    replay_from_bus,
    write_event_log,
)
from goodput.measure.accounting.table import render
from goodput.measure.metrics import GoodputGauges
from goodput.subjects import DEFAULT_JOB, check_token
from goodput.telemetry import exporter_choice, flush_metrics, setup_metrics
from goodput.tools.stack.launcher import resolve_url
from goodput.tools.stack.record import read_stack

#: replays shorter than this finish before a progress bar would be worth drawing
PROGRESS_THRESHOLD = 2000


class ReportError(Exception):
    """Something the user can fix: printed as one line, exit code 1."""


async def _replay(args: argparse.Namespace, job: str, console: Console) -> list[schemas.Event]:
    state_dir = Path(args.state_dir).resolve()
    url, _ = resolve_url(args, state_dir)
    if not url:
        raise ReportError(
            f"no bus: give --nats-url, or start one with `goodput up --state-dir {state_dir}`"
        )
    settings = msgspec.structs.replace(bus_settings_from_args(args), url=url)
    bus = await Bus.connect(settings, name="goodput-report", initial_timeout_s=10)
    try:
        with Progress(
            TextColumn("replaying events of job {task.fields[job]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            console=console,
            transient=True,
        ) as progress:
            task = progress.add_task("replay", total=None, job=job, visible=False)

            def advance(done: int, total: int) -> None:
                if total >= PROGRESS_THRESHOLD:
                    progress.update(task, completed=done, total=total, visible=True)

            return await replay_from_bus(bus, job, progress=advance, all_runs=args.all_runs)
    finally:
        await bus.close()


def _job_for_bus(args: argparse.Namespace) -> str:
    if args.job:
        return check_token(args.job, "job name")
    stack = read_stack(Path(args.state_dir).resolve())
    return stack.job if stack else DEFAULT_JOB


def export_goodput_metrics(report: GoodputReport) -> bool:
    """The report's goodput, ETTR and badput by cause as OpenTelemetry gauges, when
    ``OTEL_METRICS_EXPORTER`` asks for a push exporter; exported before the command exits (it
    outlives no period). Prometheus would scrape an endpoint gone before it looked: said once."""
    if exporter_choice("OTEL_METRICS_EXPORTER") == "prometheus":
        logging.getLogger(__name__).warning(
            "goodput report exits before a Prometheus scrape: its gauges are pushed with "
            "OTEL_METRICS_EXPORTER=otlp (an OpenTelemetry collector can expose them to Prometheus)"
        )
        return False
    if setup_metrics("goodput-report") is None:
        return False
    GoodputGauges().set(
        report.job, goodput=report.goodput_pct / 100, ettr=report.ettr, badput=report.badput
    )
    flush_metrics()
    return True


def cmd_report(args: argparse.Namespace) -> int:
    err = Console(stderr=True)
    logging.basicConfig(
        level=logging.WARNING, format="%(levelname)s %(message)s", stream=sys.stderr
    )
    try:
        if args.events:
            if args.export:
                raise ReportError("--export writes events replayed from the bus; drop --events")
            events: Iterable[schemas.Event] | Iterable[ResiliencyEvent] = iter_event_log(
                args.events, strict=not args.skip_invalid
            )
            job = args.job
        else:
            job = _job_for_bus(args)
            events = asyncio.run(_replay(args, job, err))
            if args.export:
                count = write_event_log(args.export, events)
                err.print(escape(f"wrote {count} events of job {job} to {args.export}"))
            if not events:
                raise ReportError(f"the bus holds no events of job {job!r}")
        report = compute_goodput(
            events,
            job=job,
            nominal_world_size=args.nominal_world_size,
            reference_step_time_s=args.reference_step_time,
        )
    except (
        ReportError,
        HistoryRolledOffError,
        EventLogError,
        ValueError,
        BusUnavailableError,
        BusSettingsError,
        nats.errors.Error,
        OSError,
    ) as exc:
        err.print(f"[red]goodput report:[/] {escape(str(exc))}", soft_wrap=True)
        return 1
    export_goodput_metrics(report)
    if args.html:
        # imported only here: the plots need matplotlib, slow to import and needed for nothing else
        from goodput.measure.accounting.html import write_html_report

        path = write_html_report(report, args.html)
        err.print(escape(f"HTML report: {path}"), soft_wrap=True)  # a path split is no path
    if args.json:
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(report)).decode() + "\n")
    else:
        Console().print(render(report))
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "report",
        help="goodput of a job: productive time, badput by cause, ETTR, MTBF/MTTR",
        description=(
            "Compute a job's goodput from its events: an exported JSON-lines log (--events; "
            "goodput's own events or a resiliency-calculator log, detected automatically) or "
            "the GP_EVENTS stream on the bus (--job with --nats-url / --state-dir). "
            "Definitions: docs/GOODPUT.md."
        ),
    )
    parser.add_argument("--events", metavar="FILE", help="JSON-lines event log to read")
    parser.add_argument(
        "--job",
        help="job to report (bus: default the stack's job; log: needed if it holds several)",
    )
    add_state_dir_argument(parser, "state directory of `goodput up`, to find its bus")
    parser.add_argument(
        "--all-runs",
        action="store_true",
        help="bus: every run of the job name (default: its newest run only)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--html",
        metavar="DIR",
        help="also write report.html (self-contained), timeline.png, badput.png, report.json",
    )
    parser.add_argument(
        "--export", metavar="FILE", help="write the job's events from the bus as JSON lines"
    )
    parser.add_argument(
        "--nominal-world-size",
        type=int,
        metavar="N",
        help="world size the job should run at (default: the largest seen)",
    )
    parser.add_argument(
        "--reference-step-time",
        type=float,
        metavar="SECONDS",
        help="ideal step time, for resiliency-calculator logs (which have no step events)",
    )
    parser.add_argument(
        "--skip-invalid",
        action="store_true",
        help="skip log lines that do not decode (with a warning) instead of failing",
    )
    add_bus_arguments(parser)
    parser.set_defaults(func=cmd_report)
