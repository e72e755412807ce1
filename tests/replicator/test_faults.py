"""Faults: corrupt shards, a peer gone, a replicator killed mid-transfer, the object store
down for a while. No checkpoint is ever counted complete wrongly; restore falls back."""

from __future__ import annotations

import asyncio
import os
import signal

import psutil
import pytest

from goodput import schemas
from goodput.bus.service_health import read_records
from goodput.checkpoint.engine import CheckpointEngine
from goodput_services.replicator.holdings import verify_copy
from tests.ckpt.helpers import assert_bit_exact
from tests.replicator.conftest import (
    JOB,
    Harness,
    file_checksums,
    in_store,
    make_state,
    peer_copies,
    write_checkpoint,
)


def flip_a_byte(path) -> None:
    """Corrupt a file as a new inode (a bad disk block would not touch hard links' twins...
    but this test wants exactly one tier corrupt)."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.unlink()
    path.write_bytes(bytes(data))


async def health_detail(h: Harness, node: str) -> str:
    """The health detail of the node's replicator (its newest record)."""
    records, _ = await read_records(h.bus, JOB)
    ours = [r for r in records if (r.service, r.node) == ("replicator", node)]
    return max(ours, key=lambda record: record.ts).detail


async def wait_health(h: Harness, node: str, text: str) -> str:
    for _ in range(200):
        try:
            detail = await health_detail(h, node)
        except Exception:
            detail = ""
        if text in detail:
            return detail
        await asyncio.sleep(0.1)
    raise AssertionError(f"health of {node} never said {text!r}: {detail!r}")


async def test_corrupt_shards_are_never_counted_and_restore_falls_back(
    dir_harness: Harness, tmp_path
) -> None:
    h, reps = dir_harness, dir_harness.replicators
    reps.start("node-0", replicas="1")
    reps.start("node-1", replicas="1")
    good = write_checkpoint(reps.volume("node-0"), 10, seed=1)
    await h.until(
        lambda s: peer_copies(s, "node-0", 10) == {"node-1"} and in_store(s, "node-0", 10),
        what="step 10 replicated and backed up",
    )

    # a committed checkpoint whose shard rotted after the engine sealed it: trusted by size
    # at first, found by the first reader that hashes it (the peer receiving it, the backup),
    # then hashed here, withdrawn, and never replicated, backed up or counted complete
    staging = write_checkpoint(tmp_path / "staging", 20, seed=2)
    flip_a_byte(sorted(staging.glob("data-*.bin"))[0])
    os.replace(staging, reps.volume("node-0") / staging.name)
    assert "xxh3_128 mismatch" in await wait_health(h, "node-0", "not indexed")
    snapshot = await h.snapshot()
    assert 20 not in snapshot.steps()
    assert snapshot.newest_complete().step == 10
    assert not [e for e in h.events.of(schemas.CheckpointReplicated) if e.step == 20]
    assert not [e for e in h.events.of(schemas.CheckpointBackedUp) if e.step == 20]

    # node-0 loses its volume, and one shard of the peer's copy is corrupt: that file falls
    # through to the object store, the others come from the peer
    reps.lose_volume("node-0")
    peer_copy = reps.node_dir("node-1") / "peer" / JOB / "node-0" / good.name
    flip_a_byte(sorted(peer_copy.glob("data-*.bin"))[-1])
    result = await h.restore("node-0")
    assert result.ok, result.detail
    event = h.restored_event("node-0")
    assert (event.step, event.tier) == (10, "object_store")
    assert any("peer:" in f for f in event.fallbacks), event.fallbacks
    with CheckpointEngine(reps.volume("node-0"), keep_last=0) as engine:
        step, state = engine.restore()
    assert step == 10
    assert_bit_exact(make_state(1), state)


@pytest.mark.slow
async def test_scrubbing_withdraws_a_copy_that_rotted_on_disk(dir_harness: Harness) -> None:
    h, reps = dir_harness, dir_harness.replicators
    reps.start("node-0", replicas="1")
    reps.start("node-1", scrub_interval_s="1")
    saved = write_checkpoint(reps.volume("node-0"), 10, seed=3)
    await h.until(lambda s: peer_copies(s, "node-0", 10) == {"node-1"}, what="the peer copy")
    rotten = sorted((reps.node_dir("node-1") / "peer" / JOB / "node-0" / saved.name).glob("d*"))
    with open(rotten[0], "r+b") as f:  # in place: only a re-hash can notice
        f.seek(100)
        f.write(b"bit rot")
    await h.until(lambda s: not peer_copies(s, "node-0", 10), what="the rotten copy withdrawn")
    assert "xxh3_128 mismatch" in await wait_health(h, "node-1", "not indexed")
    # node-0 notices the missing replica and sends the damaged file again
    await h.until(lambda s: peer_copies(s, "node-0", 10) == {"node-1"}, what="the repair")
    assert file_checksums(saved) == {f.name: f.xxh3_128 for f in verify_copy(rotten[0].parent)[0]}


async def test_a_peer_gone_is_replaced_then_rejoins(dir_harness: Harness) -> None:
    h, reps = dir_harness, dir_harness.replicators
    reps.start("node-0", block="b0", dedup_wait_s="0")
    reps.start("node-1", block="b0")
    reps.start("node-2", block="b1")
    await h.until(lambda s: len(s.live_nodes()) == 3, what="three nodes announced")
    # died unseen (no supervisor withdraws it): still announced, node-0 tries it, fails and
    # cools it down (peer_cooldown_s) rather than wait out the node TTL
    reps.kill("node-1")
    write_checkpoint(reps.volume("node-0"), 10, seed=4)
    await h.until(lambda s: peer_copies(s, "node-0", 10) == {"node-2"}, what="the distant copy")
    assert "replicate step 10 to node-1" in await wait_health(h, "node-0", "node-1")

    reps.start("node-1")
    await h.until(
        lambda s: peer_copies(s, "node-0", 10) == {"node-1", "node-2"},
        what="the peer that came back gets its copy",
    )


@pytest.mark.slow
async def test_replicator_killed_mid_transfer_resumes_after_restart(
    dir_harness: Harness,
) -> None:
    h, reps = dir_harness, dir_harness.replicators
    reps.start("node-0", replicas="1", dedup_wait_s="0")
    reps.start("node-1")
    await h.until(lambda s: len(s.live_nodes()) == 2, what="two nodes announced")
    # the receiving node freezes: node-0's push connects and then waits on it
    reps.signal("node-1", signal.SIGSTOP)
    saved = write_checkpoint(reps.volume("node-0"), 10, seed=5, megabytes=16)
    receiver = (await h.snapshot()).nodes["node-1"]
    sender = psutil.Process(reps.processes["node-0"].pid)
    for _ in range(100):  # until node-0's push is connected to the frozen receiver
        if any(c.raddr and c.raddr.port == receiver.port for c in sender.net_connections()):
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError("node-0 never started pushing to node-1")
    reps.kill("node-0")  # killed in the middle of its push
    reps.signal("node-1", signal.SIGCONT)
    copy_dir = reps.node_dir("node-1") / "peer" / JOB / "node-0" / saved.name
    assert not (copy_dir / "manifest.json").exists()  # nothing half-done is visible

    reps.start("node-0")
    await h.until(lambda s: peer_copies(s, "node-0", 10) == {"node-1"}, what="the resumed copy")
    assert file_checksums(copy_dir) == file_checksums(saved)
    replicated = await h.events_of(schemas.CheckpointReplicated, 1, step=10)
    assert len(replicated) == 1


@pytest.mark.slow
async def test_object_store_outage_delays_backups_but_loses_nothing(
    gcs_harness: Harness,
) -> None:
    h, reps = gcs_harness, gcs_harness.replicators
    assert h.gcs is not None
    reps.start("node-0", replicas="1")
    reps.start("node-1", replicas="1")
    await h.until(lambda s: len(s.live_nodes()) == 2, what="two nodes announced")
    h.gcs.stop()
    try:
        saved = write_checkpoint(reps.volume("node-0"), 10, seed=6)
        await h.until(lambda s: peer_copies(s, "node-0", 10) == {"node-1"}, what="peer copy")
        assert "back up step 10" in await wait_health(h, "node-0", "last error")
        assert not in_store(await h.snapshot(), "node-0", 10)
        # meanwhile a lost volume is refilled from the peer
        reps.lose_volume("node-0")
        result = await h.restore("node-0")
        assert result.ok and h.restored_event("node-0").tier == "peer", result.detail
    finally:
        h.gcs.start()
    await h.until(lambda s: in_store(s, "node-0", 10), what="the backup after the outage")
    backed_up = await h.events_of(schemas.CheckpointBackedUp, 1, step=10)
    assert [e.node for e in backed_up] == ["node-0"]
    assert file_checksums(saved) == file_checksums(reps.volume("node-0") / saved.name)


async def test_a_wait_that_times_out_says_which_replicator_died(dir_harness: Harness) -> None:
    """A replicator killed from outside logs nothing (ci: its peers saw only its port close):
    the harness's timeout message says which one is gone, and how it ended."""
    h, reps = dir_harness, dir_harness.replicators
    reps.start("node-0")
    reps.start("node-1")
    await h.until(lambda s: s.alive("node-0") and s.alive("node-1"), what="both announced")
    reps.signal("node-1", signal.SIGKILL)
    reps.processes["node-1"].wait(10)
    with pytest.raises(AssertionError) as failed:
        await h.until(lambda s: False, timeout_s=0.5, what="nothing")
    message = str(failed.value)
    assert "timed out waiting for nothing" in message
    assert '"node-1": "[exited: killed by SIGKILL]' in message
    assert '"node-0": "[running]' in message
