"""`goodput bench step-send`: what a step report costs the training loop's thread, handed to
the node's aggregator (``goodput.shim.step_rollup``) against the link's queue it went into
before (issue 36).

One report every ``--every-ms`` (a rank reports once a step: the aggregator's queue is never
full in a job, so it must not be here either), each timed alone: the queue's ``put`` (what
``BusLink.publish`` did with every report) and the datagram to a node's aggregator running in
a process of its own, as local rank 0 runs on a node. That process sends its own report of
each step too, so every rollup completes; the figures say how many reports were delivered
and in how many rollups, so a send that fell back (the rank would have published itself)
shows.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import queue
import statistics
import time
from multiprocessing.synchronize import Event
from typing import Any

from rich.console import Console

from goodput import schemas
from goodput.shim.step_rollup import StepAggregator, StepSender, channel_name
from goodput.tools.bench.arguments import positive_int

JOB, NODE = "bench-step-send", "node-0"
#: how long the aggregator's process may take to start and to finish
START_TIMEOUT_S = 60.0


def _report(rank: int, step: int) -> schemas.StepDone:
    return schemas.StepDone(
        job=JOB,
        node=NODE,
        rank=rank,
        step=step,
        step_time_s=1.0,
        tokens=4096,
        loss=2.0,
        world_size=16_384,
        compute_time_s=0.9,
    )


def _aggregate(address: bytes, ready: Event, done: Event, out: multiprocessing.Queue) -> None:
    """Local rank 0's side: bind, take the node's reports until told, say what it published."""
    sent: list[schemas.StepsDone] = []
    aggregator = StepAggregator.bind(address, job=JOB, node=NODE, rank=0, ranks=2, emit=sent.append)
    ready.set()
    if aggregator is None:
        out.put((0, 0, 0))
        return
    done.wait()
    aggregator.close()
    out.put((len(sent), sum(len(s.steps) for s in sent), aggregator.refused))


def _figures(seconds: list[float]) -> dict[str, float]:
    ordered = sorted(seconds)
    return {
        "median_us": round(statistics.median(ordered) * 1e6, 1),
        "p99_us": round(ordered[min(int(0.99 * len(ordered)), len(ordered) - 1)] * 1e6, 1),
        "max_us": round(ordered[-1] * 1e6, 1),
    }


def measure(reports: int, every_s: float) -> dict[str, Any]:
    # forked, as the control-plane bench's publishers: a spawned child's resource tracker
    # would outlive the run
    context = multiprocessing.get_context("fork")
    address = channel_name(f"bench-{os.getpid()}", JOB, 1, NODE)
    ready, done, out = context.Event(), context.Event(), context.Queue()
    process = context.Process(target=_aggregate, args=(address, ready, done, out))
    process.start()
    try:
        if not ready.wait(START_TIMEOUT_S):
            raise SystemExit("the aggregator's process did not start")
        events: queue.Queue[object] = queue.Queue()
        sender = StepSender(address)
        put, send, delivered = [], [], 0
        for step in range(reports):
            report, own = _report(1, step), _report(0, step)
            began = time.perf_counter()
            events.put((report, None))
            put.append(time.perf_counter() - began)
            began = time.perf_counter()
            delivered += sender.send(report)
            send.append(time.perf_counter() - began)
            sender.send(own)  # the aggregating rank's own: the step's rollup completes
            time.sleep(every_s)
        sender.close()
    finally:
        done.set()
        process.join(START_TIMEOUT_S)
    rollups, carried, refused = out.get(timeout=START_TIMEOUT_S)
    return {
        "reports": reports,
        "every_ms": every_s * 1e3,
        "queue_put": _figures(put),
        "datagram": _figures(send),
        "delivered": delivered,
        "rollups": rollups,
        "reports_rolled_up": carried,
        "refused": refused,
        "datagram_median_fraction_of_1s_step": statistics.median(send),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def run(args: argparse.Namespace) -> int:
    result = measure(args.reports, args.every_ms / 1e3)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    console = Console()
    for name in ("queue_put", "datagram"):
        figures = result[name]
        console.print(
            f"{name:10} median {figures['median_us']} µs, p99 {figures['p99_us']} µs, "
            f"max {figures['max_us']} µs"
        )
    console.print(
        f"delivered {result['delivered']} of {result['reports']}; "
        f"{result['rollups']} rollups carried {result['reports_rolled_up']} reports"
    )
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "step-send",
        help="a step report's cost to the trainer: the node's aggregator against the queue",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--reports", type=positive_int, default=2000, help="reports timed")
    parser.add_argument(
        "--every-ms", type=positive_int, default=5, help="milliseconds between reports"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run)
