from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from goodput.bus import Bus, EmbeddedNats
from goodput.tools.chaos import ChaosContext
from goodput.tools.stack.record import StackRecord, write_stack
from tests.chaos.processes import put_job_status, start_rank
from tests.conftest import goodput_cli
from tests.processes import stop

JOB = "chaos-job"
NODES = ("node-0", "node-1")
RANKS_PER_NODE = 2


@dataclass
class VictimJob:
    """A job of real rank processes, known to KV and stack.json as the actuator would leave it."""

    state_dir: Path
    job: str
    url: str
    bus: Bus
    ranks: dict[int, subprocess.Popen]
    extra: list[subprocess.Popen] = field(default_factory=list)
    contexts: list[ChaosContext] = field(default_factory=list)

    def context(self, seed: int | None = 0) -> ChaosContext:
        """A chaos context on this job (its bus connection is closed at teardown)."""
        ctx = ChaosContext.open(self.state_dir, seed=seed)
        self.contexts.append(ctx)
        return ctx

    async def cli(self, fault: str, *args: str) -> subprocess.CompletedProcess:
        return await asyncio.to_thread(
            goodput_cli, "chaos", fault, *args, "--state-dir", str(self.state_dir), check=False
        )

    def node_of(self, rank: int) -> str:
        return NODES[rank // RANKS_PER_NODE]


@pytest.fixture
async def victim_job(
    tmp_path: Path, nats_server: EmbeddedNats, bus: Bus
) -> AsyncIterator[VictimJob]:
    state_dir = tmp_path / "stack"
    state_dir.mkdir()
    ranks = {
        rank: start_rank(JOB, NODES[rank // RANKS_PER_NODE], rank, injectable=rank == 1)
        for rank in range(len(NODES) * RANKS_PER_NODE)
    }
    pids: dict[str, list[int]] = {}
    for rank, process in ranks.items():
        pids.setdefault(NODES[rank // RANKS_PER_NODE], []).append(process.pid)
    await put_job_status(bus, JOB, pids)
    write_stack(
        state_dir,
        StackRecord(job=JOB, url=nats_server.url, embedded=False, nodes=list(NODES), services=[]),
    )
    job = VictimJob(state_dir, JOB, nats_server.url, bus, ranks)
    yield job
    for ctx in job.contexts:
        await ctx.close()
    stop(*ranks.values(), *job.extra, timeout_s=10)
