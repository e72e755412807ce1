"""The checkpoint-index traffic of simulated nodes' replicators, for the benches that read it
(`bench index-reads`, `bench control-plane`).

Each simulated node has its address record and the copy records the store sizing counts
(``INDEX_COPIES_PER_NODE``: each kept step on every tier, each copy listing
``ranks + 2`` files). :class:`Writers` then changes the index as a fleet's replicators do:
one node's checkpoint a second (a new step on each tier, the oldest step withdrawn), and
every node's address rewritten every ``announce_s`` (the replicators' backstop refresh of
an unchanged record, spread evenly).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Sequence

from goodput import subjects
from goodput.bus import Bus
from goodput.bus.kv_scan import kv_subject
from goodput.bus.store_sizing import INDEX_COPIES_PER_NODE
from goodput.checkpoint.index.index import CheckpointIndex
from goodput.checkpoint.index.records import (
    STORE_HOLDER,
    CopyRecord,
    FileRef,
    NodeAddressRecord,
    encode,
    node_key,
)
from goodput.schemas.tiers import LOCAL, OBJECT_STORE, PEER, STORAGE_TIERS

#: each kept step has a copy on every tier (store sizing: 3 tiers x the steps kept + 1)
STEPS_KEPT = INDEX_COPIES_PER_NODE // len(STORAGE_TIERS)
#: writes in flight while the index is filled
FILL_CONCURRENCY = 256
#: the announcement period is walked in this many slices, each a share of the nodes
ANNOUNCE_SLICES = 50


def address(nodes: Sequence[str], n: int) -> NodeAddressRecord:
    """Node ``n``'s address record, stamped now (the TTL reads the stamp)."""
    return NodeAddressRecord(
        node=nodes[n], host=f"10.0.{n // 256 % 256}.{n % 256}", port=7400, ts=time.time_ns()
    )


def copies(nodes: Sequence[str], n: int, step: int, ranks: int) -> list[CopyRecord]:
    """Node ``n``'s checkpoint ``step`` on each tier: its volume, the next node's, the store.
    Only ``nodes`` hold copies: a real replicator beside them finds none of its own."""
    owner = nodes[n]
    files = [
        FileRef(f"rank-{r:05d}.distcp", 3 << 30, f"{step:08x}{n:08x}{r:016x}") for r in range(ranks)
    ]
    files += [
        FileRef(".metadata", 65536, f"{step:08x}{n:08x}{'m' * 16}"),
        FileRef("manifest", 4096, f"{step:08x}{n:08x}{'f' * 16}"),
    ]
    holders = {LOCAL: owner, PEER: nodes[(n + 1) % len(nodes)], OBJECT_STORE: STORE_HOLDER}
    return [
        CopyRecord(step=step, tier=tier, holder=holders[tier], owner=owner, root=owner, files=files)
        for tier in STORAGE_TIERS
    ]


class Writers:
    """The index of ``job`` as the replicators of ``nodes`` write it, ``ranks`` per node."""

    def __init__(self, bus: Bus, job: str, nodes: Sequence[str], ranks: int, announce_s: float):
        self.index = CheckpointIndex(bus, job)
        self.bus, self.job = bus, job
        self.nodes, self.ranks, self.announce_s = list(nodes), ranks, announce_s
        #: what the loops wrote so far: copy records put or deleted, addresses published
        self.copy_writes = 0
        self.announcements = 0

    async def fill(self) -> int:
        """Every node's address and the copies of the steps it keeps; the records written."""
        count = len(self.nodes)
        writes: list[Awaitable[object]] = [
            self.index.announce(address(self.nodes, n)) for n in range(count)
        ]
        writes += [
            self.index.put_copy(record)
            for n in range(count)
            for step in range(STEPS_KEPT)
            for record in copies(self.nodes, n, step, self.ranks)
        ]
        for start in range(0, len(writes), FILL_CONCURRENCY):
            await asyncio.gather(*writes[start : start + FILL_CONCURRENCY])
        return len(writes)

    async def churn(self) -> None:
        """One node's new checkpoint a second, its oldest withdrawn, node after node (by the
        clock: writes that take long delay the next turn, not every turn after it)."""
        started, turn = time.monotonic(), 0
        while True:
            n = turn % len(self.nodes)
            newest = STEPS_KEPT + turn // len(self.nodes)
            for record in copies(self.nodes, n, newest, self.ranks):
                await self.index.put_copy(record)
                self.copy_writes += 1
            for record in copies(self.nodes, n, newest - STEPS_KEPT, self.ranks):
                await self.index.delete_copy(record)
                self.copy_writes += 1
            turn += 1
            await asyncio.sleep(max(started + turn - time.monotonic(), 0))

    async def announce(self) -> None:
        """Every node's address every ``announce_s`` (published without waiting for acks);
        none when it is 0."""
        while self.announce_s > 0:
            started = time.monotonic()
            for index in range(ANNOUNCE_SLICES):
                for n in range(index, len(self.nodes), ANNOUNCE_SLICES):
                    key = node_key(self.job, self.nodes[n])
                    subject = kv_subject(subjects.CKPT_INDEX_BUCKET, key)
                    await self.bus.nc.publish(subject, encode(address(self.nodes, n)))
                    self.announcements += 1
                pause = started + (index + 1) * self.announce_s / ANNOUNCE_SLICES - time.monotonic()
                await asyncio.sleep(max(pause, 0))
