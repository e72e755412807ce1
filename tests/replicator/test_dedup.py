"""Identical data-parallel checkpoints on three nodes cost about one replica of traffic:
peers verify instead of copying, and the object store gets each unique shard once."""

from __future__ import annotations

from goodput import schemas
from goodput.checkpoint.format import read_manifest
from tests.replicator.conftest import Harness, in_store, peer_copies, write_checkpoint

STEP = 10
NODES = {"node-0": "b0", "node-1": "b0", "node-2": "b1"}
PAIRS = (("node-0", "node-1"), ("node-1", "node-0"))


async def test_three_identical_replicas_move_about_one_replica(gcs_harness: Harness) -> None:
    h, reps = gcs_harness, gcs_harness.replicators
    # every node is announced before the checkpoints appear, and the leader is waited for
    # longer than a loaded CI machine can delay it: one upload per unique shard is then
    # deterministic rather than a race against ``backup_wait_s``
    for node, block in NODES.items():
        reps.start(node, block=block, backup_wait_s="60")
    await h.until(lambda s: len(s.live_nodes()) == len(NODES), what="every replicator announced")
    # pure data parallelism: every node's ranks save the same state
    dirs = [write_checkpoint(reps.volume(node), STEP, seed=3) for node in NODES]
    manifests = [read_manifest(d) for d in dirs]
    assert len({m.to_bytes() for m in manifests}) == 3  # manifests differ (creation time)...
    assert len({frozenset((f.name, f.xxh3_128) for f in m.files) for m in manifests}) == 1
    replica_bytes = sum(f.size for f in manifests[0].files)  # ...the data does not

    await h.until(
        lambda s: all(len(peer_copies(s, n, STEP)) == 2 and in_store(s, n, STEP) for n in NODES),
        what="every node replicated to two peers and backed up",
    )
    replicated = await h.events_of(schemas.CheckpointReplicated, 6, STEP)
    backed_up = await h.events_of(schemas.CheckpointBackedUp, 3, STEP)
    assert len(backed_up) == 3
    assert {(e.node, e.peer) for e in replicated} == {
        (node, peer) for node in NODES for peer in NODES if peer != node
    }
    # each replication covers a full checkpoint, verified in place rather than sent
    assert all(e.bytes_sent + e.bytes_deduplicated == replica_bytes for e in replicated)
    sent = sum(e.bytes_sent for e in replicated)
    assert sent <= replica_bytes, f"{sent} bytes sent between peers"
    uploaded = sum(e.bytes_uploaded for e in backed_up)
    unique = sum({f.xxh3_128: f.size for f in manifests[0].files}.values())
    assert uploaded == unique, f"{uploaded} bytes uploaded for {unique} unique bytes"

    # each peer copy is a real, complete checkpoint on the holder's disk
    for node in NODES:
        for holder in peer_copies(await h.snapshot(), node, STEP):
            copy = reps.node_dir(holder) / "peer" / "job-rep" / node / f"step-{STEP:010d}"
            original = reps.volume(node) / f"step-{STEP:010d}"
            assert read_manifest(copy).to_bytes() == read_manifest(original).to_bytes()


async def test_a_spare_receives_identical_data_once(dir_harness: Harness) -> None:
    h, reps = dir_harness, dir_harness.replicators
    for node, block in NODES.items():
        reps.start(node, block=block, dedup_wait_s="1")
    # node-2 is a spare: it holds nothing, so it needs a real copy — but only one
    dirs = [write_checkpoint(reps.volume(node), STEP, seed=4) for node in ("node-0", "node-1")]
    replica_bytes = sum(f.size for f in read_manifest(dirs[0]).files)
    await h.until(
        lambda s: all(peer_copies(s, n, STEP) == {"node-2", m} for n, m in PAIRS),
        what="both nodes replicated to each other and to the spare",
    )
    replicated = await h.events_of(schemas.CheckpointReplicated, 4, STEP)
    to_spare = [e for e in replicated if e.peer == "node-2"]
    assert sorted(e.bytes_sent for e in to_spare) == [0, replica_bytes]
    assert sum(e.bytes_sent for e in replicated) == replica_bytes
