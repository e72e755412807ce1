"""A straggler made real: a process paused and resumed so it runs 1/factor of the wall time.

Each ``period_s`` the process runs for ``period_s / factor`` and is stopped (SIGSTOP) for the
rest, so its throughput drops by ``factor`` while it stays alive and heartbeating (slowly) —
what a rank on a node with a failing NIC or a throttled GPU looks like. It is always resumed
(SIGCONT) at the end, on cancellation and on SIGTERM.

``python -m goodput.tools.chaos.straggler`` runs the same cycle as a detached background process
(``goodput chaos slow-rank --detach``); its record in ``<state-dir>/chaos/`` lets
``goodput chaos slow-rank --clear`` stop it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import time
from pathlib import Path

import msgspec
import psutil

from goodput.bus.embedded import pid_alive
from goodput.state_dir import StateDir


class StragglerRecord(msgspec.Struct, kw_only=True):
    """A detached duty-cycle process, so it can be found and stopped."""

    worker_pid: int
    target_pid: int
    job: str
    rank: int
    factor: float
    until_epoch_s: float


async def duty_cycle(pid: int, factor: float, duration_s: float, period_s: float = 0.2) -> str:
    """Slow ``pid`` down by ``factor`` for ``duration_s``; returns what happened."""
    run_s = period_s / factor
    started = time.monotonic()
    deadline = started + duration_s
    cycles = 0
    try:
        while time.monotonic() < deadline:
            cycle_start = time.monotonic()
            os.kill(pid, signal.SIGCONT)
            await asyncio.sleep(max(cycle_start + run_s - time.monotonic(), 0))
            os.kill(pid, signal.SIGSTOP)
            await asyncio.sleep(max(cycle_start + period_s - time.monotonic(), 0))
            cycles += 1
    except ProcessLookupError:
        return f"target exited after {time.monotonic() - started:.1f} s ({cycles} cycles)"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    return f"ran at 1/{factor:g} speed for {duration_s:g} s ({cycles} cycles of {period_s:g} s)"


def stop_detached(state_dir: Path, job: str, rank: int) -> str:
    """Stop a detached straggler (it resumes its target on SIGTERM)."""
    path = StateDir(state_dir).slow_rank_record(job, rank)
    if not path.exists():
        return f"no detached slow-rank for rank {rank} of job {job}"
    record = msgspec.json.decode(path.read_bytes(), type=StragglerRecord)
    try:
        cmdline = psutil.Process(record.worker_pid).cmdline()
    except psutil.NoSuchProcess:
        cmdline = []
    if "goodput.tools.chaos.straggler" in cmdline:
        os.kill(record.worker_pid, signal.SIGTERM)
        deadline = time.monotonic() + 5
        while pid_alive(record.worker_pid) and time.monotonic() < deadline:
            time.sleep(0.02)
    path.unlink(missing_ok=True)
    with contextlib.suppress(ProcessLookupError):
        os.kill(record.target_pid, signal.SIGCONT)
    return f"stopped the slow-rank of rank {rank} (pid {record.target_pid} resumed)"


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m goodput.tools.chaos.straggler")
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--factor", type=float, required=True)
    parser.add_argument("--duration", type=float, required=True)
    parser.add_argument("--period", type=float, default=0.2)
    args = parser.parse_args(argv)
    path = StateDir(Path(args.state_dir)).slow_rank_record(args.job, args.rank)

    async def run() -> str:
        task = asyncio.ensure_future(duty_cycle(args.pid, args.factor, args.duration, args.period))
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, task.cancel)
        try:
            return await task
        except asyncio.CancelledError:
            return "stopped"

    try:
        print(asyncio.run(run()), flush=True)
    finally:
        with contextlib.suppress(FileNotFoundError):
            record = msgspec.json.decode(path.read_bytes(), type=StragglerRecord)
            if record.worker_pid == os.getpid():
                path.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(_main())
