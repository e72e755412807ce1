"""The index follower on a real nats-server: one complete read, then only the changes; other
writers' puts and deletes seen, its own at once; a lost consumer or a restarted server
answered with a complete read again."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path

import nats.errors
import pytest

from goodput import subjects
from goodput.bus import Bus, BusSettings, EmbeddedNats
from goodput.bus.cluster import EmbeddedCluster
from goodput.checkpoint.index.follower import IndexBehind, IndexFollower
from goodput.checkpoint.index.index import CheckpointIndex, IndexSnapshot
from goodput.checkpoint.index.records import CopyRecord, FileRef, NodeAddressRecord, encode
from goodput.state_dir import StateDir

JOB = "job-follow"
STREAM = f"KV_{subjects.CKPT_INDEX_BUCKET}"
#: records present before the follower starts: many, so a re-read would show in the counts
NODES = 100
STEPS = 6


def copy(step: int, holder: str, owner: str, tier: str = "local") -> CopyRecord:
    files = [FileRef(f"rank-{r}.distcp", 1 << 30, f"{step:04d}{r:028x}") for r in range(10)]
    return CopyRecord(step=step, tier=tier, holder=holder, owner=owner, root=owner, files=files)


def address(node: str) -> NodeAddressRecord:
    return NodeAddressRecord(node=node, host="127.0.0.1", port=7000, ts=time.time_ns())


def copies_of(snapshot: IndexSnapshot) -> set[tuple[int, str, str, str]]:
    return {(c.step, c.tier, c.holder, c.owner) for c in snapshot.all_copies}


async def filled(bus: Bus) -> CheckpointIndex:
    """Another node's writer, on a connection of its own, with the job's records in place."""
    index = CheckpointIndex(bus, JOB)
    for n in range(NODES):
        await index.announce(address(f"node-{n}"))
        for step in range(STEPS):
            await index.put_copy(copy(step, f"node-{n}", f"node-{n}"))
    return index


@pytest.fixture
async def writer(bus: Bus) -> CheckpointIndex:
    return await filled(bus)


@contextlib.asynccontextmanager
async def following(url: str, wait_s: float = 1.0) -> AsyncIterator[IndexFollower]:
    bus = await Bus.connect(BusSettings(url=url), name="test-follower")
    try:
        async with IndexFollower(bus, JOB, wait_s=wait_s).running() as follower:
            await follower.snapshot()
            yield follower
    finally:
        await bus.close()


async def test_it_reads_only_the_changes_after_one_complete_read(
    nats_server: EmbeddedNats, bus: Bus, writer: CheckpointIndex
) -> None:
    async with following(nats_server.url) as follower:
        first = await follower.snapshot()
        assert len(first.all_copies) == NODES * STEPS and len(first.nodes) == NODES
        assert follower.counts.reads == 1 and not follower.counts.messages
        full_read_bytes = NODES * STEPS * len(encode(copy(0, "node-0", "node-0")))

        added = [copy(STEPS, f"node-{n}", f"node-{n}") for n in range(3)]
        for record in added:
            await writer.put_copy(record)
        removed = [copy(0, f"node-{n}", f"node-{n}") for n in range(2)]
        for record in removed:
            await writer.delete_copy(record)
        new_node = address("node-new")
        await writer.announce(new_node)

        after = await follower.snapshot(current=True)
        expected = copies_of(first) | copies_of(IndexSnapshot({}, added))
        expected -= copies_of(IndexSnapshot({}, removed))
        assert copies_of(after) == expected
        assert "node-new" in after.nodes

        counts = follower.counts
        assert counts.reads == 1, "no second complete read"
        assert counts.messages == {"copy": len(added) + len(removed), "node": 1, "mark": 1}
        assert counts.bytes["copy"] == sum(len(encode(r)) for r in added)  # deletes: none
        assert counts.bytes["node"] == len(encode(new_node))
        assert counts.bytes.total() < full_read_bytes / 20
        assert copies_of(after) == copies_of(await writer.snapshot()), "as a full read sees it"


async def test_its_own_writes_are_in_the_next_snapshot(
    nats_server: EmbeddedNats, writer: CheckpointIndex
) -> None:
    async with following(nats_server.url) as follower:
        own = CheckpointIndex(follower.bus, JOB)
        await own.put_copy(copy(STEPS, "node-0", "node-1", tier="peer"))
        await own.delete_copy(copy(1, "node-0", "node-0"))
        seen = copies_of(await follower.snapshot(after_seq=own.written_seq))
        assert (STEPS, "peer", "node-0", "node-1") in seen
        assert (1, "local", "node-0", "node-0") not in seen
        assert not follower.counts.messages["mark"], "read-your-writes needs no mark"


async def test_its_step_views_are_rebuilt_only_for_what_changed(
    nats_server: EmbeddedNats, writer: CheckpointIndex
) -> None:
    """Issue 36: a poll with nothing changed reuses every step's view; one change rebuilds
    the views of the steps it touched, and no other."""
    async with following(nats_server.url) as follower:
        first = await follower.snapshot()
        views = first.views()
        assert [v.step for v in views] == list(reversed(range(STEPS)))
        built = follower.view_cache.built
        assert built == STEPS
        again = await follower.snapshot()
        assert again is not first and again.all_copies is first.all_copies
        assert all(a is b for a, b in zip(again.views(), views, strict=True))
        assert follower.view_cache.built == built, "nothing changed: nothing rebuilt"

        own = CheckpointIndex(follower.bus, JOB)
        await own.put_copy(copy(2, "node-0", "node-1", tier="peer"))
        changed = await follower.snapshot(after_seq=own.written_seq)
        assert follower.view_cache.built == built
        rebuilt = {v.step for v in changed.views() if all(v is not w for w in views)}
        assert rebuilt == {2} and follower.view_cache.built == built + 1
        assert changed.views() == IndexSnapshot(changed.nodes, changed.all_copies).views()

        # a holder's TTL lapsing changes what counts without a message: the views follow
        lapsed = await follower.snapshot(node_ttl_s=1e-9)
        assert lapsed.views() == [] and lapsed.live_names == frozenset()
        assert (await follower.snapshot()).views() == changed.views()


async def test_a_deleted_consumer_means_a_complete_read_again(
    nats_server: EmbeddedNats, bus: Bus, writer: CheckpointIndex, caplog: pytest.LogCaptureFixture
) -> None:
    async with following(nats_server.url) as follower:
        (consumer,) = await bus.js.consumers_info(STREAM)
        with caplog.at_level(logging.WARNING, logger="goodput.checkpoint.index.follower"):
            await bus.js.delete_consumer(STREAM, consumer.name)
            await writer.put_copy(copy(STEPS, "node-3", "node-3"))  # while it had none
            await writer.delete_copy(copy(2, "node-3", "node-3"))
            seen = copies_of(await follower.snapshot(current=True))
        assert (STEPS, "local", "node-3", "node-3") in seen
        assert (2, "local", "node-3", "node-3") not in seen
        assert follower.counts.reads == 2
        assert "reading the whole index again" in caplog.text


async def test_a_restarted_server_means_a_complete_read_again(
    nats_server: EmbeddedNats, bus: Bus, writer: CheckpointIndex
) -> None:
    async with following(nats_server.url) as follower:
        await asyncio.to_thread(nats_server.stop)
        await asyncio.to_thread(nats_server.start)
        await writer.put_copy(copy(STEPS, "node-5", "node-5"))
        seen = copies_of(await follower.snapshot(current=True, timeout_s=30))
        assert (STEPS, "local", "node-5", "node-5") in seen
        assert len(seen) == NODES * STEPS + 1
        assert follower.counts.reads == 2


@pytest.mark.slow
async def test_losing_the_server_of_its_consumer_means_a_complete_read_again(
    tmp_path: Path,
) -> None:
    """On a three-server cluster: the server holding the follower's consumer (one replica)
    is killed; the follower reads the index again from a survivor, writes made after the
    loss included."""
    with EmbeddedCluster(StateDir(tmp_path / "nats")) as cluster:
        bus = await Bus.connect(BusSettings(url=cluster.url), name="test-writer")
        try:
            await bus.provision()
            writer = await filled(bus)
            async with following(cluster.url) as follower:
                (consumer,) = await bus.js.consumers_info(STREAM)
                assert consumer.cluster is not None and consumer.cluster.leader
                member = int(consumer.cluster.leader.rsplit("-", 1)[1])
                await asyncio.to_thread(cluster.kill, member)
                for _ in range(300):  # the bucket may be electing a leader: writes refused
                    try:
                        await writer.put_copy(copy(STEPS, "node-7", "node-7"))
                        await writer.delete_copy(copy(0, "node-7", "node-7"))
                        break
                    except nats.errors.Error:
                        await asyncio.sleep(0.1)
                seen = copies_of(await follower.snapshot(current=True, timeout_s=60))
                assert (STEPS, "local", "node-7", "node-7") in seen
                assert (0, "local", "node-7", "node-7") not in seen
                assert len(seen) == NODES * STEPS
                assert follower.counts.reads == 2
        finally:
            await bus.close()


async def test_no_snapshot_before_a_complete_read(bus: Bus) -> None:
    with pytest.raises(IndexBehind):
        await IndexFollower(bus, JOB).snapshot(timeout_s=0.2)
