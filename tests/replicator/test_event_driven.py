"""Replication starts as a checkpoint is committed in the node's volume (the replicator's
watch of it, no event), trusts the engine's seal for the node's own checkpoints and the peer server's receive check for copies, and still never
indexes a torn copy (sizes) nor keeps a rotten one past its scrub (real processes)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from goodput.checkpoint.format import read_manifest
from goodput.checkpoint.index.index import CheckpointIndex, IndexSnapshot
from tests.replicator.conftest import Harness, peer_copies, write_checkpoint

pytestmark = pytest.mark.timeout(120)

#: a poll so slow that only the volume's watch can start replication within the deadline
SLOW_POLL = {"poll_s": "30", "node_ttl_s": "120", "dedup_wait_s": "0", "replicas": "1"}


def checked(h: Harness, node: str) -> list[dict]:
    """The replicator's "copy checked" log lines: how each copy was checked, and the
    process's hashing totals when it was."""
    text = (h.replicators.state_dir / f"replicator-{node}.log").read_text(errors="replace")
    entries = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    return [e for e in entries if e.get("msg") == "copy checked"]


async def until(index: CheckpointIndex, predicate, timeout_s: float, what: str) -> IndexSnapshot:
    deadline = time.monotonic() + timeout_s
    while True:
        snapshot = await index.snapshot(node_ttl_s=120)
        if predicate(snapshot):
            return snapshot
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


def own_steps(snapshot: IndexSnapshot, node: str) -> set[int]:
    return {c.step for c in snapshot.copies if c.tier == "local" and c.holder == node}


async def test_replication_starts_on_the_commit_and_each_byte_is_hashed_once_more(
    dir_harness: Harness,
) -> None:
    h, reps = dir_harness, dir_harness.replicators
    for node in ("node-a", "node-b"):
        reps.start(node, **SLOW_POLL)
    await until(
        h.index,
        lambda s: {n.node for n in s.live_nodes()} >= {"node-a", "node-b"},
        30,
        "both nodes announced",
    )
    await asyncio.sleep(1.0)  # past the start-up pass (which hashes what it finds)
    saved = write_checkpoint(reps.volume("node-a"), step=7, seed=7)
    # the next poll is ~30 s away: only the watch can get the copy there in time
    await until(h.index, lambda s: peer_copies(s, "node-a", 7) == {"node-b"}, 15, "peer copy")

    copy_bytes = read_manifest(saved).total_bytes
    [own] = [e for e in checked(h, "node-a") if e["step"] == 7]
    assert (own["tier"], own["check"], own["hashed_bytes"]) == ("local", "sealed", 0)
    [received] = [e for e in checked(h, "node-b") if e["step"] == 7]
    assert (received["tier"], received["check"]) == ("peer", "received")
    # the receiver hashed each byte once, as it arrived, and its scan did not again
    assert received["hashed_bytes"] == copy_bytes == received["copy_bytes"]


async def test_a_truncated_own_checkpoint_is_never_indexed_and_a_rotten_one_is_withdrawn(
    dir_harness: Harness, tmp_path: Path
) -> None:
    h, reps = dir_harness, dir_harness.replicators
    reps.start("node-a", scrub_interval_s="2")
    await h.until(lambda s: "node-a" in s.nodes, what="node-a announced")
    await asyncio.sleep(1.0)  # past the start-up pass
    volume = reps.volume("node-a")
    volume.mkdir(parents=True, exist_ok=True)

    # torn: a file shorter than its sealed size, committed (manifest present) all the same
    torn = write_checkpoint(tmp_path / "elsewhere", step=3, seed=3)
    shard = sorted(torn.glob("data-*.bin"))[0]
    os.truncate(shard, shard.stat().st_size // 2)
    os.rename(torn, volume / torn.name)
    # rotten: same sizes, one byte flipped, so only hashing can tell
    rotten = write_checkpoint(tmp_path / "elsewhere", step=4, seed=4)
    shard = sorted(rotten.glob("data-*.bin"))[0]
    with open(shard, "r+b") as f:
        first = f.read(1)
        f.seek(0)
        f.write(bytes([first[0] ^ 0xFF]))
    os.rename(rotten, volume / rotten.name)

    # the rotten one passes the cheap check (the engine's seal, its sizes) and is withdrawn
    # as soon as something hashes it: the backup's check before upload, or the scrub
    deadline = time.monotonic() + 30
    while not [e for e in checked(h, "node-a") if e["step"] == 4]:
        assert time.monotonic() < deadline, "step 4 never checked"
        await asyncio.sleep(0.2)
    [first] = [e for e in checked(h, "node-a") if e["step"] == 4]
    assert first["check"] == "sealed"
    log = reps.state_dir / "replicator-node-a.log"
    while "step-0000000004: data-r00000-000.bin: xxh3_128 mismatch" not in log.read_text():
        assert time.monotonic() < deadline, "step 4 never hashed again"
        await asyncio.sleep(0.2)
    await h.until(lambda s: not own_steps(s, "node-a") & {3, 4}, what="neither step indexed")
    assert "step-0000000003: data-r00000-000.bin: size" in log.read_text()
