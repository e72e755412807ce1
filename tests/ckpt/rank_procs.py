"""Start a job's rank processes (torch.distributed env: RANK, LOCAL_RANK, WORLD_SIZE, ...),
one log per rank, and check how each exited."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.examples.launch import free_port
from tests.processes import kill


def run_ranks_of(
    job: Path,
    args: list[str],
    world: int,
    logs: Path,
    *,
    per_node: int | None = None,
    tag: str = "rank",
    expect: dict[int, int] | None = None,
    timeout_s: float = 240,
) -> None:
    """Run ``world`` ranks of ``job`` (``per_node`` ranks a node, all of them by default)
    and assert each exited with its ``expect``ed code (0 unless named), logs in the message
    (``logs/<tag>-<rank>.log``)."""
    per_node = per_node or world
    env = dict(
        os.environ,
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(per_node),
    )
    files = [logs / f"{tag}-{rank}.log" for rank in range(world)]
    processes = []
    for rank, log in enumerate(files):
        with open(log, "wb") as sink:
            processes.append(
                subprocess.Popen(
                    [sys.executable, str(job), *args],
                    env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank % per_node)),
                    stdout=sink,
                    stderr=subprocess.STDOUT,
                )
            )
    try:
        codes = [process.wait(timeout=timeout_s) for process in processes]
    finally:
        kill(*processes)
    wanted = [(expect or {}).get(rank, 0) for rank in range(world)]
    tails = "\n".join(f"--- {log.name}\n{log.read_text()[-3000:]}" for log in files)
    assert codes == wanted, f"exit codes {codes}, expected {wanted}\n{tails}"
