"""The checkpoint index: which node and tier holds which step's files, and what is complete.

A step is complete when every file of one node's checkpoint of it (for pure data-parallel
jobs that is the full state) is held, verified, by some live copy: on a live node's volume
or peer area, or in the object store. Files are matched by checksum, so identical
data-parallel replicas on different nodes serve as copies of each other.

A checkpoint sharded across nodes is one part per node (``goodput.checkpoint.format.parts``):
its step is complete when, for one commit id, every part 0..n-1 has a verified live copy on
some tier. A part alone is never a checkpoint, a part is matched only with copies of the same
part of the same commit, and a commit with a part that has no copy (a node lost during the
global commit) leaves the step incomplete, so the previous complete step stays the newest.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property

from nats.js.api import Header
from nats.js.errors import APIError
from nats.js.kv import KV_DEL, KV_OP, KeyValue

from goodput import subjects
from goodput.bus import Bus
from goodput.bus.kv_scan import current_entries, kv_subject
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
from goodput.schemas.tiers import TIERS, StorageTier

log = logging.getLogger(__name__)

#: a node whose announcement is older than this holds nothing, as far as the index is
#: concerned. Announcements are written on change and refreshed every ``node_ttl_s /
#: REFRESHES_PER_TTL`` (``index/announcement.py``): the TTL is the backstop for a node that
#: died unseen; a node that stops in order, or that the supervisor counts as failed, has its
#: record withdrawn at once (:meth:`CheckpointIndex.withdraw_node`)
DEFAULT_NODE_TTL_S = 900.0
#: refreshes in one TTL: a node missing one refresh (a bus outage, a leader change) still lives
REFRESHES_PER_TTL = 3


#: JetStream's refusals of a conditional write whose subject's last sequence differs
WRONG_LAST_SEQUENCE = (10071, 10164)

#: a record of the index bucket, as its key's kind says to decode it
Record = NodeAddressRecord | CopyRecord


class CheckpointIndex:
    """Reads and writes the index records of one job in the ``gp_ckpt_index`` bucket."""

    def __init__(self, bus: Bus, job: str):
        self.bus = bus
        self.job = job
        #: stream sequence of this object's newest acknowledged write: a reader that has seen
        #: the bucket's log up to it sees every write made here (read-your-writes)
        self.written_seq = 0

    async def _kv(self) -> KeyValue:
        return await self.bus.kv(subjects.CKPT_INDEX_BUCKET)

    def _wrote(self, seq: int) -> None:
        self.written_seq = max(self.written_seq, seq)

    async def announce(self, record: NodeAddressRecord) -> int:
        """Write the node's address record; its stream sequence (what a withdrawal names)."""
        seq = await (await self._kv()).put(node_key(self.job, record.node), encode(record))
        self._wrote(seq)
        return seq

    async def withdraw_node(self, node: str, *, if_last_seq: int = 0) -> bool:
        """Delete ``node``'s address record: it holds nothing from now on (its copies stop
        counting). ``if_last_seq``: only if the record is still the one written at that
        sequence (a replicator stopping must not withdraw a newer announcement of its node's);
        False when it was not. Removing an absent record is harmless (a marker is written)."""
        subject = kv_subject(subjects.CKPT_INDEX_BUCKET, node_key(self.job, node))
        headers = {KV_OP: KV_DEL}
        if if_last_seq:
            headers[Header.EXPECTED_LAST_SUBJECT_SEQUENCE] = str(if_last_seq)
        try:
            ack = await self.bus.js.publish(subject, headers=headers)
        except APIError as exc:
            if if_last_seq and exc.err_code in WRONG_LAST_SEQUENCE:
                return False
            raise
        self._wrote(ack.seq)
        return True

    async def put_copy(self, record: CopyRecord) -> None:
        self._wrote(await (await self._kv()).put(copy_key(self.job, record), encode(record)))

    async def delete_copy(self, record: CopyRecord) -> None:
        # KeyValue.delete writes this marker too but does not return its sequence
        subject = kv_subject(subjects.CKPT_INDEX_BUCKET, copy_key(self.job, record))
        self._wrote((await self.bus.js.publish(subject, headers={KV_OP: KV_DEL})).seq)

    async def snapshot(self, node_ttl_s: float = DEFAULT_NODE_TTL_S) -> IndexSnapshot:
        """Every record of the job, read in one complete pass (a timeout raises instead of
        returning a partial view, which could make a complete step look incomplete)."""
        entries = await current_entries(self.bus, subjects.CKPT_INDEX_BUCKET, job_keys(self.job))
        decoded = (decode_entry(key, value) for key, value in entries.items())
        nodes, copies = split_records(r for r in decoded if r is not None)
        return IndexSnapshot(nodes, copies, node_ttl_s)


def job_keys(job: str) -> str:
    """The key filter of every index record of ``job``."""
    return subjects.kv_key(job, ">")


def decode_entry(key: str, value: bytes) -> Record | None:
    """The record an index entry holds; None (logged) for one that is no valid record: a
    forged or newer entry is skipped, never half-read."""
    kind = key_kind(key)
    try:
        if kind == "node":
            return decode_node(value)
        if kind == "copy":
            return decode_copy(value)
    except IndexRecordError as exc:
        log.warning("ignoring undecodable index record %s: %s", key, exc)
    return None


def split_records(
    records: Iterable[Record],
) -> tuple[dict[str, NodeAddressRecord], list[CopyRecord]]:
    """Node name -> its address record, and every copy record: what a snapshot holds."""
    nodes: dict[str, NodeAddressRecord] = {}
    copies: list[CopyRecord] = []
    for record in records:
        if isinstance(record, NodeAddressRecord):
            nodes[record.node] = record
        else:
            copies.append(record)
    return nodes, copies


@dataclass(frozen=True)
class FileLocations:
    file: FileRef
    copies: tuple[CopyRecord, ...]  # live copies holding a file with this size and checksum

    @property
    def tiers(self) -> set[str]:
        return {c.tier for c in self.copies}


#: (commit id, part count): one checkpoint sharded across nodes
Commit = tuple[str, int]


@dataclass(frozen=True)
class StepView:
    """One step across tiers: each owner's file set and where every file can be found
    (whole checkpoints), and each commit's parts with their copies (sharded across nodes)."""

    step: int
    copies: tuple[CopyRecord, ...]
    #: owner node -> its files with their locations (whole checkpoints only)
    owners: dict[str, tuple[FileLocations, ...]]
    #: (commit, part count) -> part -> its live copies, nearest tier first
    commits: dict[Commit, dict[int, tuple[CopyRecord, ...]]] = field(default_factory=dict)
    #: tier -> :meth:`complete_in`'s answer: a view is shared by every snapshot until its
    #: step's copies change, so each question over its owners is asked once
    _complete_in: dict[StorageTier, bool] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @cached_property
    def _complete_owners(self) -> tuple[str, ...]:
        return tuple(sorted(o for o, files in self.owners.items() if all(f.copies for f in files)))

    def complete_owners(self) -> list[str]:
        return list(self._complete_owners)

    def complete_commit(self) -> Commit | None:
        """The commit of which every part has a copy (the smallest id if, oddly, several)."""
        whole = [key for key, parts in self.commits.items() if len(parts) == key[1]]
        return min(whole) if whole else None

    def part_copies(self, part: int) -> tuple[CopyRecord, ...]:
        """The live copies of ``part`` of the complete commit, nearest tier first."""
        commit = self.complete_commit()
        return self.commits[commit].get(part, ()) if commit else ()

    @property
    def part_count(self) -> int:
        """How many parts the complete commit has; 0 for a whole checkpoint (or none)."""
        commit = self.complete_commit()
        return commit[1] if commit else 0

    @cached_property
    def complete(self) -> bool:
        return bool(self._complete_owners) or self.complete_commit() is not None

    def owner_for(self, node: str) -> str | None:
        """Whose checkpoint ``node`` should restore: its own if complete, else any complete one."""
        complete = self._complete_owners
        return node if node in complete else (complete[0] if complete else None)

    def complete_in(self, tier: StorageTier) -> bool:
        """Some owner's full file set is on ``tier`` (each file somewhere on that tier), or
        every part of one commit is."""
        known = self._complete_in.get(tier)
        if known is None:
            known = self._complete_in[tier] = self._is_complete_in(tier)
        return known

    def _is_complete_in(self, tier: StorageTier) -> bool:
        if any(all(tier in f.tiers for f in files) for files in self.owners.values() if files):
            return True
        return any(
            len(parts) == count and all(any(c.tier == tier for c in cs) for cs in parts.values())
            for (_, count), parts in self.commits.items()
        )

    @property
    def bytes(self) -> int:
        """The size of one full copy: the largest owner's, or the complete commit's parts."""
        sizes = [sum(f.file.size for f in files) for files in self.owners.values()]
        commit = self.complete_commit()
        if commit is not None:
            sizes.append(sum(cs[0].total_bytes for cs in self.commits[commit].values()))
        return max(sizes, default=0)


#: tiers on a node's disk: their copies count only while their holder lives
ON_NODE_TIERS = frozenset(name for name, tier in TIERS.items() if tier.on_node)
#: tier name -> its nearness (the order copies are listed in), looked up once
NEARNESS = {name: tier.nearness for name, tier in TIERS.items()}


class ViewCache:
    """The step views of the newest snapshot built, for the next one to reuse: what a view
    depends on is its step's live copies, so a snapshot of the same records and the same
    live nodes reuses the list, and one after a change rebuilds only the steps whose copies
    changed (compared by identity: the follower keeps unchanged records' objects). One per
    follower; a snapshot read once (``goodput ckpt``) has its own."""

    def __init__(self) -> None:
        #: (all copies, live nodes) of the newest list built, and that list
        self._whole: tuple[list[CopyRecord], frozenset[str], list[StepView]] | None = None
        #: step -> its live copies, and the view built of them
        self._steps: dict[int, tuple[tuple[CopyRecord, ...], StepView]] = {}
        #: views built, not reused: what a test of the reuse counts
        self.built = 0

    def views(self, snapshot: IndexSnapshot) -> list[StepView]:
        whole = self._whole
        if whole and whole[0] is snapshot.all_copies and whole[1] == snapshot.live_names:
            return whole[2]
        steps: dict[int, tuple[tuple[CopyRecord, ...], StepView]] = {}
        for step, copies in sorted(snapshot.copies_by_step.items(), reverse=True):
            known = self._steps.get(step)
            if known is None or known[0] != copies:  # tuples compare identity first
                known = (copies, build_view(step, copies))
                self.built += 1
            steps[step] = known
        views = [view for _, view in steps.values()]
        # whole objects swapped in: a thread reading the cache sees the old one or the new
        self._steps = steps
        self._whole = (snapshot.all_copies, snapshot.live_names, views)
        return views


@dataclass
class IndexSnapshot:
    """The index at one moment. Its derived lists are computed once (the records and the
    clock do not change under it); a follower's snapshots share its :class:`ViewCache`."""

    nodes: dict[str, NodeAddressRecord]
    all_copies: list[CopyRecord]
    node_ttl_s: float = DEFAULT_NODE_TTL_S
    now_ns: int = field(default_factory=time.time_ns)
    view_cache: ViewCache = field(default_factory=ViewCache, repr=False, compare=False)

    def alive(self, node: str) -> bool:
        record = self.nodes.get(node)
        return record is not None and (self.now_ns - record.ts) / 1e9 < self.node_ttl_s

    @cached_property
    def live_names(self) -> frozenset[str]:
        """The nodes alive now: with the records, all that the views depend on."""
        return frozenset(name for name in self.nodes if self.alive(name))

    def live_nodes(self) -> list[NodeAddressRecord]:
        return [r for name, r in sorted(self.nodes.items()) if name in self.live_names]

    @cached_property
    def copies(self) -> list[CopyRecord]:
        """Copies that count: those no node holds (the object store's), and those held by
        live nodes."""
        live = self.live_names
        return [c for c in self.all_copies if c.tier not in ON_NODE_TIERS or c.holder in live]

    @cached_property
    def copies_by_step(self) -> dict[int, tuple[CopyRecord, ...]]:
        """Step -> its live copies, in the order of :attr:`copies` (one pass)."""
        grouped: dict[int, list[CopyRecord]] = {}
        for copy in self.copies:
            grouped.setdefault(copy.step, []).append(copy)
        return {step: tuple(copies) for step, copies in grouped.items()}

    def steps(self) -> list[int]:
        return sorted(self.copies_by_step, reverse=True)

    def view(self, step: int) -> StepView:
        return build_view(step, self.copies_by_step.get(step, ()))

    @cached_property
    def _views(self) -> list[StepView]:
        return self.view_cache.views(self)

    def views(self) -> list[StepView]:
        """Every step's view, newest first (built once per change, shared: do not mutate)."""
        return list(self._views)

    def complete_steps(self) -> list[int]:
        """Complete steps, newest first."""
        return [v.step for v in self.views() if v.complete]

    def newest_complete(self) -> StepView | None:
        """The answer to "what is the newest complete step, and where is each file"."""
        return next((v for v in self.views() if v.complete), None)

    def copies_held_by(self, holder: str) -> list[CopyRecord]:
        """Every record of ``holder``, live or not (what it must confirm or withdraw)."""
        return [c for c in self.all_copies if c.holder == holder]


def build_view(step: int, copies: tuple[CopyRecord, ...]) -> StepView:
    """The view of ``step`` from its live ``copies`` (in index order)."""
    commits: dict[Commit, dict[int, list[CopyRecord]]] = {}
    for copy in sorted(copies, key=lambda c: (NEARNESS[c.tier], c.holder, c.owner)):
        if copy.is_part:
            commits.setdefault((copy.commit, copy.parts), {}).setdefault(copy.part, [])
            commits[(copy.commit, copy.parts)][copy.part].append(copy)
    copies_of_parts = {
        key: {part: tuple(cs) for part, cs in sorted(parts.items())}
        for key, parts in commits.items()
    }
    whole = [c for c in copies if not c.is_part]
    by_content: dict[tuple[int, str], list[CopyRecord]] = {}
    first: dict[tuple[str, str, str], CopyRecord] = {}
    alike: dict[tuple[str, str, str], list[CopyRecord]] = {}  # only where two share a key
    for copy in whole:
        key = (copy.tier, copy.holder, copy.owner)
        if first.setdefault(key, copy) is not copy:
            others = alike.setdefault(key, [first[key]])
            if copy in others:  # the same record under a second key holds nothing more
                continue
            others.append(copy)
        for f in copy.files:
            holders = by_content.setdefault((f.size, f.xxh3_128), [])
            if not holders or holders[-1] is not copy:  # a content listed twice: one holder
                holders.append(copy)
    owners: dict[str, tuple[FileLocations, ...]] = {}
    for copy in sorted(whole, key=lambda c: (c.owner, NEARNESS[c.tier])):
        if copy.owner not in owners:
            owners[copy.owner] = tuple(
                FileLocations(f, tuple(by_content[(f.size, f.xxh3_128)])) for f in copy.files
            )
    return StepView(step, copies, owners, copies_of_parts)
