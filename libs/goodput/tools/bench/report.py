"""`goodput bench report`: `goodput report` on a large, realistic event log.

A generator writes a job's log in both formats `goodput report` reads: goodput's own events
(4 ranks on 2 nodes, a StepDone per rank per step, checkpoints every 100 steps with their
saves, persists and replications, host health, a crash every 5,000 steps with its signal,
decision, action, restart and restore, now and then a straggler) and the resiliency
calculator's log (a checkpoint_saved every 100 steps, a termination and restart every 20,000
checkpoints). Each report runs in its own process, as a user runs it; the benchmark records
its wall time, peak RSS (``wait4``), the size of the JSON report and the timeline's size.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import msgspec
from rich.console import Console
from rich.table import Table

from goodput import schemas
from goodput.schemas.tiers import LOCAL, PEER

JOB = "bench-report"
NODES = ("node-0", "node-1")
RANKS_PER_NODE = 2
CKPT_EVERY = 100
CRASH_EVERY = 5000
STRAGGLER_EVERY = 7000
HOST_HEALTH_EVERY = 30
RESILIENCY_CRASH_EVERY = 20_000
START_NS = 1_700_000_000 * 10**9
NS = 10**9
#: how often the child's peak memory is read (it only grows, so the last reading is the peak
#: up to the final moments, which only write the JSON)
POLL_S = 0.05


def _goodput_events(count: int, seed: int) -> Iterator[schemas.Event]:
    """About ``count`` events of one job, in publication order."""
    rng = random.Random(seed)
    world = len(NODES) * RANKS_PER_NODE
    ranks = [
        (node, n * RANKS_PER_NODE + local)
        for n, node in enumerate(NODES)
        for local in range(RANKS_PER_NODE)
    ]
    now = START_NS
    emitted = 0
    attempt = 0

    def start(restore_step: int | None) -> Iterator[schemas.Event]:
        nonlocal now
        for node, rank in ranks:
            now += 20_000_000
            yield schemas.RankStarted(
                job=JOB,
                ts=now,
                node=node,
                rank=rank,
                local_rank=rank % RANKS_PER_NODE,
                world_size=world,
                pid=10_000 + attempt * world + rank,
                attempt=attempt,
            )
        if restore_step is not None:
            now += 2 * NS
            for node, rank in ranks:
                yield schemas.CheckpointRestored(
                    job=JOB,
                    ts=now + rank,
                    node=node,
                    rank=rank,
                    step=restore_step,
                    tier=PEER if rank == 1 else LOCAL,
                    duration_s=1.5,
                    bytes=1 << 30,
                )
        now += 3 * NS

    for event in start(None):
        emitted += 1
        yield event
    step, saved, since_crash = 0, 0, 0
    while emitted < count:
        step += 1
        since_crash += 1
        step_time = 1.0 + rng.random() * 0.05
        now += int(step_time * NS)
        for node, rank in ranks:
            yield schemas.StepDone(
                job=JOB,
                ts=now + rank,
                node=node,
                rank=rank,
                step=step,
                step_time_s=step_time,
                tokens=8192,
                loss=2.0 + 1.0 / step,
                world_size=world,
                compute_time_s=step_time * 0.9,
            )
        emitted += world
        if step % HOST_HEALTH_EVERY == 0:
            for node in NODES:
                yield schemas.HostHealth(
                    job=JOB,
                    ts=now + 100 + len(node),
                    node=node,
                    healthy=True,
                    gpu_available=True,
                    ranks_alive=RANKS_PER_NODE,
                    ranks_expected=RANKS_PER_NODE,
                )
            emitted += len(NODES)
        if step % STRAGGLER_EVERY == 0:
            emitted += 1
            yield schemas.Signal(
                job=JOB,
                ts=now + 200,
                signal="straggler",
                node="node-1",
                rank=3,
                severity="info",
                detail="rank 3 at 1.4x the median",
                observed_ts=now - 5 * NS,
            )
        if step % CKPT_EVERY == 0:
            now += 200_000_000
            for node, rank in ranks:
                yield schemas.CheckpointSaved(
                    job=JOB,
                    ts=now + rank,
                    node=node,
                    rank=rank,
                    step=step,
                    stall_s=0.2,
                    bytes=1 << 28,
                )
            for node, rank in ranks:
                yield schemas.CheckpointPersisted(
                    job=JOB,
                    ts=now + 300_000_000 + rank,
                    node=node,
                    rank=rank,
                    step=step,
                    path=f"/ckpt/step-{step}/rank-{rank}",
                    bytes=1 << 28,
                    duration_s=0.3,
                )
            for index, node in enumerate(NODES):
                yield schemas.CheckpointReplicated(
                    job=JOB,
                    ts=now + 400_000_000 + index,
                    node=node,
                    peer=NODES[(index + 1) % len(NODES)],
                    step=step,
                    bytes_sent=1 << 27,
                    bytes_deduplicated=1 << 27,
                    duration_s=0.4,
                )
            emitted += 2 * world + len(NODES)
            saved = step
        if since_crash == CRASH_EVERY:
            since_crash = 0
            now += int(0.5 * NS)
            crash = now
            signal = schemas.Signal(
                job=JOB,
                ts=crash + 2 * NS,
                signal="crash",
                node="node-0",
                rank=1,
                detail="rank 1 exited with code 1",
                observed_ts=crash,
            )
            decision = schemas.Decision(
                job=JOB,
                ts=crash + 2_100_000_000,
                signal_id=signal.signal_id,
                policy="builtin",
                rule="in_job_restart",
                reason="correctable crash",
                command_ids=["c"],
            )
            burst: list[schemas.Event] = [
                schemas.RankExited(job=JOB, ts=crash, node="node-0", rank=1, pid=1, exit_code=1),
                signal,
                decision,
            ]
            burst += [
                schemas.RankExited(
                    job=JOB,
                    ts=crash + 3 * NS + rank,
                    node=node,
                    rank=rank,
                    pid=1,
                    exit_code=None,
                    signal=9,
                    expected_reason="restart",
                )
                for node, rank in ranks
                if rank != 1
            ]
            burst.append(
                schemas.ActionResult(
                    job=JOB,
                    ts=crash + 4 * NS,
                    command_id="c",
                    action="restart",
                    ok=True,
                    duration_s=1.9,
                )
            )
            now = crash + 5 * NS
            attempt += 1
            burst += list(start(saved))
            emitted += len(burst)
            yield from burst
            step = saved


def _resiliency_lines(count: int) -> Iterator[bytes]:
    """About ``count`` lines of a resiliency-calculator log of one job."""
    second = 1_700_000_000.0
    emitted, step, saved = 0, 0, 0

    def line(kind: str, at: float, step: int | None = None) -> bytes:
        record: dict[str, object] = {
            "timestamp": datetime.fromtimestamp(at, UTC).isoformat(),
            "job_name": JOB,
            "event_type": kind,
            "node_rank": 0,
        }
        if step is not None:
            record["step"] = step
        return json.dumps(record).encode()

    yield line("user_scheduled", second)
    emitted += 1
    while emitted < count:
        second += 30.0
        yield line("job_started", second)
        emitted += 1
        if saved:
            second += 20.0
            yield line("checkpoint_loaded", second, saved)
            emitted += 1
        step = saved
        for _ in range(min(RESILIENCY_CRASH_EVERY, max(count - emitted - 1, 1))):
            step += CKPT_EVERY
            second += CKPT_EVERY * 1.02
            yield line("checkpoint_saved", second, step)
            emitted += 1
        saved = step
        second += 50.0  # work after the last checkpoint, lost to the crash
        yield line("job_terminated", second)
        emitted += 1


def write_logs(directory: Path, events: int, seed: int = 0) -> dict[str, Path]:
    """Write both logs of about ``events`` lines each; their paths by format."""
    paths = {"events": directory / "events.jsonl", "resiliency": directory / "resiliency.jsonl"}
    encoder = msgspec.json.Encoder()
    with open(paths["events"], "wb") as out:
        batch = bytearray()
        for event in _goodput_events(events, seed):
            encoder.encode_into(event, batch, -1)
            batch += b"\n"
            if len(batch) > 1 << 20:
                out.write(batch)
                batch.clear()
        out.write(batch)
    with open(paths["resiliency"], "wb") as out:
        out.writelines(line + b"\n" for line in _resiliency_lines(events))
    return paths


#: `goodput report` alone: the same parser and code path, without importing the other
#: subcommands (the job example pulls in torch, ~200 MB that the report never uses)
_REPORT_ONLY = (
    "import argparse, sys; from goodput.tools.cli import report; "
    "parser = argparse.ArgumentParser(prog='goodput'); "
    "report.register(parser.add_subparsers()); "
    "args = parser.parse_args(sys.argv[1:]); sys.exit(args.func(args))"
)


def _high_water_kb(pid: int) -> int:
    """The process's peak RSS so far (Linux VmHWM). Not ``wait4``'s ``ru_maxrss``: that one
    counts the parent's memory the child had between fork and exec."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _run_report(log: Path, output: Path) -> dict:
    """`goodput report --events LOG --json` in a child process: wall and CPU seconds, peak
    RSS, JSON size (CPU time, unlike wall time, does not grow with other work on the host)."""
    command = [sys.executable, "-c", _REPORT_ONLY, "report", "--events", str(log), "--json"]
    with open(output, "wb") as out:
        started = time.perf_counter()
        child = subprocess.Popen(command, stdout=out, stderr=subprocess.PIPE)
        peak_kb = 0
        while True:
            peak_kb = max(peak_kb, _high_water_kb(child.pid))
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            time.sleep(POLL_S)
        wall = time.perf_counter() - started
        child.returncode = os.waitstatus_to_exitcode(status)
        stderr = child.stderr.read().decode() if child.stderr else ""
    if child.returncode != 0:
        raise RuntimeError(f"goodput report failed ({child.returncode}): {stderr.strip()}")
    report = json.loads(output.read_bytes())
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "peak_rss_mb": round(peak_kb / 1024, 1),
        "json_bytes": output.stat().st_size,
        "steps": len(report["timeline"]["steps"]),
        "markers": len(report["timeline"]["markers"]),
        "spans": len(report["timeline"]["spans"]),
        "goodput_pct": report["goodput_pct"],
    }


def run(args: argparse.Namespace) -> int:
    results = []
    with tempfile.TemporaryDirectory(prefix="goodput-bench-report-") as tmp:
        directory = Path(tmp)
        started = time.perf_counter()
        paths = write_logs(directory, args.events)
        generated = time.perf_counter() - started
        for source, path in paths.items():
            with open(path, "rb") as log:
                lines = sum(1 for _ in log)
            for attempt in range(args.repeat):
                result = _run_report(path, directory / f"{source}-{attempt}.json")
                results.append(
                    {
                        "format": source,
                        "events": lines,
                        "log_mb": round(path.stat().st_size / 1e6, 1),
                        "run": attempt + 1,
                        **result,
                    }
                )
    if args.json:
        print(json.dumps({"generate_s": round(generated, 1), "runs": results}, indent=2))
        return 0
    table = Table(title=f"goodput report on generated logs (generated in {generated:.1f} s)")
    for column in results[0]:
        table.add_column(column, justify="left" if column == "format" else "right")
    for result in results:
        table.add_row(*(str(value) for value in result.values()))
    Console().print(table)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "report",
        help="`goodput report` on a generated log: wall time, peak RSS, JSON size",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--events", type=int, default=1_000_000, help="lines per log (default 1,000,000)"
    )
    parser.add_argument("--repeat", type=int, default=1, help="reports per format (default 1)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(func=run)
