"""Real processes for host-monitor and chaos tests: victim ranks, host monitors, the job status.

A victim rank is a real Python process carrying the environment the actuator gives a rank
(GOODPUT_JOB, GOODPUT_NODE, RANK), in its own session as the actuator starts them; the job
status is written to KV exactly where the actuator writes it.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from goodput import schemas, subjects
from goodput.bus import Bus

VICTIM_CODE = "import time\nprint('ready', flush=True)\nwhile True:\n    time.sleep(0.02)\n"


def start_rank(job: str, node: str, rank: int, *, injectable: bool = False) -> subprocess.Popen:
    env = {
        **os.environ,
        "GOODPUT_JOB": job,
        "GOODPUT_NODE": node,
        "RANK": str(rank),
        **({"GOODPUT_ENABLE_FAULT_INJECTION": "1"} if injectable else {}),
    }
    process = subprocess.Popen(
        [sys.executable, "-c", VICTIM_CODE],
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    # a rank is found by its environment, which /proc shows reliably only once it runs
    assert process.stdout is not None and process.stdout.readline() == "ready\n"
    return process


async def put_job_status(
    bus: Bus,
    job: str,
    pids: dict[str, list[int]],
    state: str = "running",
    attempt: int = 1,
    run_id: str = "",
) -> schemas.JobStatus:
    status = schemas.JobStatus(
        job=job,
        state=state,  # type: ignore[arg-type]
        attempt=attempt,
        world_size=sum(len(p) for p in pids.values()),
        procs_per_node=max((len(p) for p in pids.values()), default=0),
        active_nodes=sorted(pids),
        pids=pids,
        run_id=run_id,
    )
    kv = await bus.kv(subjects.STATE_BUCKET)
    await kv.put(subjects.kv_key(job, "job_status"), schemas.encode(status))
    return status


def start_hostmon(
    url: str, state_dir: Path, job: str, node: str, *options: str
) -> subprocess.Popen:
    state_dir.mkdir(parents=True, exist_ok=True)
    log = open(state_dir / f"hostmon-{node}.log", "ab")  # noqa: SIM115 - the child keeps it
    argv = [
        sys.executable,
        "-m",
        "goodput_services.hostmon",
        *("--job", job, "--node", node, "--state-dir", str(state_dir), "--nats-url", url),
        *(item for option in options for item in ("--set", option)),
    ]
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    return process


class HealthTap:
    """Every HostHealth a job publishes from now on (core subscription on the event subject).

    ``wait_for`` reads the reports in order: each call starts after the report the previous
    call matched (or after the last ``mark()``).
    """

    def __init__(self, bus: Bus, job: str):
        self.bus = bus
        self.job = job
        self.reports: list[schemas.HostHealth] = []
        self._next = 0
        self._subscription = None

    async def start(self) -> HealthTap:
        async def collect(msg) -> None:
            self.reports.append(schemas.decode_event(msg.data))  # type: ignore[arg-type]

        self._subscription = await self.bus.nc.subscribe(
            subjects.event(self.job, "host_health"), cb=collect
        )
        return self

    def mark(self) -> None:
        """Only reports published after this call count for the next ``wait_for``."""
        self._next = len(self.reports)

    async def wait_for(
        self, predicate: Callable[[schemas.HostHealth], bool], timeout_s: float = 20.0
    ) -> schemas.HostHealth:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            while self._next < len(self.reports):
                report = self.reports[self._next]
                self._next += 1
                if predicate(report):
                    return report
            await asyncio.sleep(0.02)
        last = self.reports[-1] if self.reports else None
        raise AssertionError(f"no matching host health within {timeout_s} s; last: {last}")


def process_state(pid: int) -> str:
    try:
        return psutil.Process(pid).status()
    except psutil.NoSuchProcess:
        return "gone"
