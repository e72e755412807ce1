"""The replication pipeline, end to end: engine persist → held by a peer, and its hashing.

Two replicator processes (nodes A and B) on an embedded nats-server, as `goodput up` starts
them. A checkpoint appears on A's volume and ``CheckpointPersisted`` is emitted, as the
engine does; the clock stops when B's copy is in the index. Run twice in one go: with the
replicators' ``legacy_scan`` (the behaviour before issue 26: found by polling, hashed by
every scan) and without (started as A's replicator sees the commit in its volume, the
engine's seal trusted, the copy verified once as B receives it; the event goes to the bus's
other readers, not to a replicator).

Hashing is read from the replicators' own tally (``goodput.checkpoint.format.hash_totals``), which they
log with each copy they check: A's when it indexes its own checkpoint, B's when it indexes
the copy. Both start with empty volumes, so the tallies are this checkpoint's alone (A's
backup, which re-hashes what it uploads, comes after and is not counted).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from goodput import schemas
from goodput.bus import Bus, BusSettings, EmbeddedNats
from goodput.checkpoint.format import node_volume, step_dir_name
from goodput.checkpoint.index.index import CheckpointIndex, IndexSnapshot
from goodput.schemas.tiers import PEER
from goodput.state_dir import StateDir

JOB = "bench-pipeline"
NODES = ("nodeA", "nodeB")
#: one peer copy, sent at once (no wait for identical peers); the rest as deployed
OPTIONS = {"replicas": "1", "dedup_wait_s": "0", "gc_interval_s": "3600"}
TIMEOUT_S = 300.0


def measure_pipeline(
    work: Path, step: int, write: Callable[[Path], object], replica_bytes: int, console: Console
) -> dict:
    """``{"before": …, "after": …}``; ``write(volume)`` commits the checkpoint there."""
    result = {}
    for mode, legacy in (("before", True), ("after", False)):
        state_dir = work / f"pipeline-{mode}"
        state_dir.mkdir(parents=True)
        with console.status(f"replication pipeline, {mode} (legacy_scan={legacy})"):
            result[mode] = _one_run(state_dir, step, write, replica_bytes, legacy)
        shutil.rmtree(state_dir, ignore_errors=True)
    return result


def _one_run(
    state_dir: Path, step: int, write: Callable[[Path], object], replica_bytes: int, legacy: bool
) -> dict:
    with EmbeddedNats(StateDir(state_dir)) as server:
        processes = {node: _start_replicator(server.url, state_dir, node, legacy) for node in NODES}
        try:
            seconds = asyncio.run(_persist_and_wait(server.url, state_dir, step, write))
        finally:
            for process in processes.values():
                process.terminate()
            for process in processes.values():
                try:
                    process.wait(30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
    owner = _checked(state_dir / "replicator-nodeA.log", tier="local", step=step)
    peer = _checked(state_dir / "replicator-nodeB.log", tier="peer", step=step)
    gb = replica_bytes / 1e9
    return {
        "legacy_scan": legacy,
        "persisted_to_peer_s": round(seconds, 3),
        "owner_check": owner["check"],
        "peer_check": peer["check"],
        "hashed_bytes": {
            "writer": replica_bytes,
            "owner_replicator": owner["hashed_bytes"],
            "peer_replicator": peer["hashed_bytes"],
        },
        "hashes_per_byte": round(
            (replica_bytes + owner["hashed_bytes"] + peer["hashed_bytes"]) / replica_bytes, 3
        ),
        "hash_cpu_s": round(owner["hash_cpu_s"] + peer["hash_cpu_s"], 4),
        "hash_cpu_s_per_gb": round((owner["hash_cpu_s"] + peer["hash_cpu_s"]) / gb, 4),
    }


def _start_replicator(url: str, state_dir: Path, node: str, legacy: bool) -> subprocess.Popen:
    options = {**OPTIONS, "legacy_scan": str(legacy).lower()}
    sets = [item for k, v in options.items() for item in ("--set", f"{k}={v}")]
    with open(state_dir / f"replicator-{node}.log", "ab") as log:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "goodput_services.replicator",
                *("--job", JOB, "--node", node, "--nats-url", url),
                *("--state-dir", str(state_dir), *sets),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )


async def _persist_and_wait(
    url: str, state_dir: Path, step: int, write: Callable[[Path], object]
) -> float:
    """Seconds from the persist event to B's copy in the index (both nodes up first)."""
    bus = await Bus.connect(BusSettings(url=url), name="goodput-bench-pipeline")
    try:
        await bus.provision()
        index = CheckpointIndex(bus, JOB)
        await _until(index, lambda s: {n.node for n in s.live_nodes()} >= set(NODES), "nodes up")
        volume = node_volume(state_dir, NODES[0], JOB)
        await asyncio.to_thread(write, volume)
        persisted = time.monotonic()
        await bus.emit(
            schemas.CheckpointPersisted(
                job=JOB,
                node=NODES[0],
                rank=0,
                step=step,
                path=str(volume / step_dir_name(step)),
                bytes=0,
                duration_s=0.0,
            )
        )
        await _until(
            index,
            lambda s: any(
                c.tier == PEER and c.owner == NODES[0] and c.holder == NODES[1] for c in s.copies
            ),
            "the peer copy",
        )
        return time.monotonic() - persisted
    finally:
        await bus.close()


async def _until(
    index: CheckpointIndex, predicate: Callable[[IndexSnapshot], bool], what: str
) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not predicate(await index.snapshot()):
        if time.monotonic() > deadline:
            raise RuntimeError(f"replication pipeline: timed out waiting for {what}")
        await asyncio.sleep(0.02)


def _checked(log: Path, *, tier: str, step: int) -> dict:
    """The replicator's "copy checked" log line for ``step`` in ``tier``."""
    for line in log.read_text(errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        entry = json.loads(line)
        if entry.get("msg") == "copy checked" and (entry["tier"], entry["step"]) == (tier, step):
            return entry
    raise RuntimeError(f"{log.name}: no checked {tier} copy of step {step}")
