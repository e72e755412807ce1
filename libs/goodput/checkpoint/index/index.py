"""The checkpoint index: which node and tier holds which step's files, and what is complete.

A step is complete when every file of one node's checkpoint of it (for pure data-parallel
jobs that is the full state) is held, verified, by some live copy: on a live node's volume
or peer area, or in the object store. Files are matched by checksum, so identical
data-parallel replicas on different nodes serve as copies of each other.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from nats.js.kv import KeyValue

from goodput import subjects
from goodput.bus import Bus
from goodput.bus.kv_scan import current_entries
from goodput.checkpoint.index.records import (
    CopyRecord,
    FileRef,
    IndexRecordError,
    NodeAddressRecord,
    copy_key,
    decode_copy,
    decode_node,
    encode,
    key_kind,
    node_key,
)
from goodput.schemas.events import StorageTier

log = logging.getLogger(__name__)

TIER_ORDER: dict[str, int] = {"present": 0, "local": 0, "peer": 1, "object_store": 2}
#: a node whose announcement is older than this holds nothing, as far as the index is concerned
DEFAULT_NODE_TTL_S = 15.0


class CheckpointIndex:
    """Reads and writes the index records of one job in the ``gp_ckpt_index`` bucket."""

    def __init__(self, bus: Bus, job: str):
        self.bus = bus
        self.job = job

    async def _kv(self) -> KeyValue:
        return await self.bus.kv(subjects.CKPT_INDEX_BUCKET)

    async def announce(self, record: NodeAddressRecord) -> None:
        await (await self._kv()).put(node_key(self.job, record.node), encode(record))

    async def put_copy(self, record: CopyRecord) -> None:
        await (await self._kv()).put(copy_key(self.job, record), encode(record))

    async def delete_copy(self, record: CopyRecord) -> None:
        await (await self._kv()).delete(copy_key(self.job, record))

    async def snapshot(self, node_ttl_s: float = DEFAULT_NODE_TTL_S) -> IndexSnapshot:
        """Every record of the job, read in one complete pass (a timeout raises instead of
        returning a partial view, which could make a complete step look incomplete)."""
        entries = await current_entries(
            self.bus, subjects.CKPT_INDEX_BUCKET, subjects.kv_key(self.job, ">")
        )
        nodes: dict[str, NodeAddressRecord] = {}
        copies: list[CopyRecord] = []
        for key, value in entries.items():
            kind = key_kind(key)
            try:
                if kind == "node":
                    record = decode_node(value)
                    nodes[record.node] = record
                elif kind == "copy":
                    copies.append(decode_copy(value))
            except IndexRecordError as exc:
                log.warning("ignoring undecodable index record %s: %s", key, exc)
        return IndexSnapshot(nodes, copies, node_ttl_s)


@dataclass(frozen=True)
class FileLocations:
    file: FileRef
    copies: tuple[CopyRecord, ...]  # live copies holding a file with this size and checksum

    @property
    def tiers(self) -> set[str]:
        return {c.tier for c in self.copies}


@dataclass(frozen=True)
class StepView:
    """One step across tiers: each owner's file set, and where every file can be found."""

    step: int
    copies: tuple[CopyRecord, ...]
    #: owner node -> its files with their locations
    owners: dict[str, tuple[FileLocations, ...]]

    def complete_owners(self) -> list[str]:
        return sorted(o for o, files in self.owners.items() if all(f.copies for f in files))

    @property
    def complete(self) -> bool:
        return bool(self.complete_owners())

    def owner_for(self, node: str) -> str | None:
        """Whose checkpoint ``node`` should restore: its own if complete, else any complete one."""
        complete = self.complete_owners()
        return node if node in complete else (complete[0] if complete else None)

    def complete_in(self, tier: StorageTier) -> bool:
        """Some owner's full file set is on ``tier`` (each file somewhere on that tier)."""
        return any(all(tier in f.tiers for f in files) for files in self.owners.values() if files)

    @property
    def bytes(self) -> int:
        sizes = [sum(f.file.size for f in files) for files in self.owners.values()]
        return max(sizes, default=0)


@dataclass
class IndexSnapshot:
    nodes: dict[str, NodeAddressRecord]
    all_copies: list[CopyRecord]
    node_ttl_s: float = DEFAULT_NODE_TTL_S
    now_ns: int = field(default_factory=time.time_ns)

    def alive(self, node: str) -> bool:
        record = self.nodes.get(node)
        return record is not None and (self.now_ns - record.ts) / 1e9 < self.node_ttl_s

    def live_nodes(self) -> list[NodeAddressRecord]:
        return [r for name, r in sorted(self.nodes.items()) if self.alive(name)]

    @property
    def copies(self) -> list[CopyRecord]:
        """Copies that count: the object store's, and those held by live nodes."""
        return [c for c in self.all_copies if c.tier == "object_store" or self.alive(c.holder)]

    def steps(self) -> list[int]:
        return sorted({c.step for c in self.copies}, reverse=True)

    def view(self, step: int) -> StepView:
        copies = tuple(c for c in self.copies if c.step == step)
        by_content: dict[tuple[int, str], list[CopyRecord]] = {}
        for copy in copies:
            for f in copy.files:
                holders = by_content.setdefault((f.size, f.xxh3_128), [])
                if copy not in holders:
                    holders.append(copy)
        owners: dict[str, tuple[FileLocations, ...]] = {}
        for copy in sorted(copies, key=lambda c: (c.owner, TIER_ORDER[c.tier])):
            if copy.owner not in owners:
                owners[copy.owner] = tuple(
                    FileLocations(f, tuple(by_content[(f.size, f.xxh3_128)])) for f in copy.files
                )
        return StepView(step, copies, owners)

    def views(self) -> list[StepView]:
        return [self.view(step) for step in self.steps()]

    def complete_steps(self) -> list[int]:
        """Complete steps, newest first."""
        return [v.step for v in self.views() if v.complete]

    def newest_complete(self) -> StepView | None:
        """The answer to "what is the newest complete step, and where is each file"."""
        return next((v for v in self.views() if v.complete), None)

    def copies_held_by(self, holder: str) -> list[CopyRecord]:
        """Every record of ``holder``, live or not (what it must confirm or withdraw)."""
        return [c for c in self.all_copies if c.holder == holder]
