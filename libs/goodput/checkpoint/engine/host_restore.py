"""Restore from host memory: the engine's buffer still holds the snapshot it persisted.

A rank restarting in process kept its memory, so reading its checkpoint back from the volume
is wasted time. The bytes come from the buffer instead, checked against the committed
manifest's per-file xxh3_128 (the manifest itself verified as on any restore), so a buffer
that does not hold exactly what was committed is never loaded: the caller falls back to the
volume.

Ranks that share a node's volume split each checkpoint among them (``dp_world`` > 1, one
contiguous slice of the byte stream each, ``goodput.checkpoint.engine.plan``), so a rank's
buffer holds only its slice. With ``node_shared`` engines the other slices are in the node's
other segments (``goodput.checkpoint.engine.node_segments``: survivors' buffers, and a
killed rank's, whose segment outlives it until the next save): each file is read from the
segment that claims it and checked against its digest; a file no segment holds intact is
read from the volume, verified as on a cold restore. The manifest is committed only once
every rank's files are written, so the volume holds them all.

A sharded (FSDP2) checkpoint is restored into the template's DTensors, each rank's local
shards placed by the reshard planner (``goodput.checkpoint.engine.sharded_load``): the ranges
of each saving rank's stream come from that rank's buffer or segment when it holds them
intact (block digests of its shard record), otherwise from the volume. No full tensor is
built for a DTensor target.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import xxhash

from goodput.checkpoint.engine.engine import CheckpointEngine
from goodput.checkpoint.engine.fileio import CorruptCheckpointError
from goodput.checkpoint.engine.load_into import merge_into
from goodput.checkpoint.engine.node_segments import BufferSource, PeerSegment, StreamSource
from goodput.checkpoint.engine.plan import SavePlan, StreamIndex
from goodput.checkpoint.engine.reader import READ_CHUNK_BYTES
from goodput.checkpoint.engine.restore import prepare_targets, read_files
from goodput.checkpoint.engine.sharded_load import load_shards
from goodput.checkpoint.engine.tree import TreeError
from goodput.checkpoint.format import (
    KIND_ENGINE,
    KIND_SHARDED,
    FileEntry,
    Manifest,
    ManifestError,
    read_manifest,
    step_dir,
)


@dataclass(frozen=True)
class HostRestore:
    """A restore from host memory: the step, the state loaded, its size and duration.

    ``host_bytes`` came from host memory (this rank's buffer and the node's segments), the
    rest of ``bytes`` from the volume."""

    step: int
    state: Any
    bytes: int
    duration_s: float
    host_bytes: int
    #: page-locked memory the staged copies to the GPU went through, released since
    pinned_bytes: int = 0

    @property
    def volume_bytes(self) -> int:
        return self.bytes - self.host_bytes


def _own_files(manifest: Manifest, plan: SavePlan, data: torch.Tensor) -> list[FileEntry] | str:
    """The committed files that lie in this rank's slice, each checked against the buffer's
    bytes; a string says why the buffer cannot serve them."""
    if [(t.offset, t.nbytes) for t in manifest.tensors] != [
        (t.offset, t.nbytes) for t in plan.tensors
    ]:
        return "the buffer's layout differs from the manifest's"
    mine = [
        entry
        for entry in manifest.files
        if plan.slice_start <= entry.offset and entry.offset + entry.size <= plan.slice_end
    ]
    if sum(entry.size for entry in mine) != plan.slice_bytes:
        return "the manifest's data files do not tile this rank's slice"
    view = data.numpy().data
    for entry in mine:
        start = entry.offset - plan.slice_start
        if xxhash.xxh3_128_hexdigest(view[start : start + entry.size]) != entry.xxh3_128:
            return f"{entry.name}: the buffer does not match the committed checksum"
    return mine


def _scatter(
    index: StreamIndex, views: list[torch.Tensor | None], data: torch.Tensor, start: int
) -> None:
    """Copy stream bytes ``[start, start + len(data))`` into the tensors' byte views."""
    for tensor_index, lo, hi in index.overlapping(start, start + data.numel()):
        view = views[tensor_index]
        if view is not None:
            first = index.entries[tensor_index].offset + lo - start
            view[lo:hi].copy_(data[first : first + hi - lo])


def _from_peer(
    peer: PeerSegment,
    entry: FileEntry,
    index: StreamIndex,
    views: list[torch.Tensor | None],
    staging: torch.Tensor,
) -> bool:
    """One file's bytes from a node-mate's segment, chunk by chunk through ``staging`` (so
    the bytes hashed are the bytes used), into the views; False if they are not the file's
    (the views then hold bad bytes, which the volume read of the file replaces)."""
    hasher = xxhash.xxh3_128()
    view = staging.numpy().data
    for lo in range(0, entry.size, len(view)):
        size = min(len(view), entry.size - lo)
        if not peer.read(entry.offset + lo, view[:size]):
            return False
        hasher.update(view[:size])
        _scatter(index, views, staging[:size], entry.offset + lo)
    return hasher.hexdigest() == entry.xxh3_128


def _peer_files(
    files: list[FileEntry],
    peers: list[PeerSegment],
    index: StreamIndex,
    views: list[torch.Tensor | None],
) -> list[FileEntry]:
    """Fill the ``files`` that a segment of the node holds intact (each segment claiming a
    file tried in turn); returns the others."""
    claims = [
        [p for p in peers if p.covers(entry.offset, entry.offset + entry.size)] for entry in files
    ]
    wanted = max((e.size for e, c in zip(files, claims, strict=True) if c), default=0)
    staging = torch.empty(min(READ_CHUNK_BYTES, max(wanted, 1)), dtype=torch.uint8)
    return [
        entry
        for entry, claimants in zip(files, claims, strict=True)
        if not any(_from_peer(peer, entry, index, views, staging) for peer in claimants)
    ]


def _restore_plain(
    engine: CheckpointEngine,
    path: Path,
    manifest: Manifest,
    into: Any,
    own: tuple[SavePlan, torch.Tensor] | None,
    peers: list[PeerSegment],
) -> tuple[Any, int, int] | str:
    """A replicas' checkpoint: own slice, then node segments, then the volume (the state,
    the bytes read from the volume, the pinned bytes its GPU copies went through)."""
    mine: list[FileEntry] = []
    whole: frozenset[int] = frozenset()
    if own is not None:
        plan, data = own
        found = _own_files(manifest, plan, data)
        if isinstance(found, str):
            return found
        mine = found
        if not mine and not peers:
            return f"host memory holds none of the {manifest.stream_bytes} bytes"
        # tensors wholly in the slice are copied from the buffer in one piece: straight into
        # a contiguous target, even on a GPU (no staging)
        whole = frozenset(
            i
            for i, t in enumerate(manifest.tensors)
            if plan.slice_start <= t.offset and t.offset + t.nbytes <= plan.slice_end
        )
    index = StreamIndex(manifest.tensors)
    try:
        targets = prepare_targets(manifest, into, engine.policy, whole=whole)
    except TreeError as exc:  # a tree no save writes: forged or damaged, so the volume's turn
        return f"step {manifest.step}'s state tree: {exc}"
    if own is not None:
        plan, data = own
        for entry in mine:
            start = entry.offset - plan.slice_start
            _scatter(index, targets.views, data[start : start + entry.size], entry.offset)
    names = {entry.name for entry in mine}
    rest = [entry for entry in manifest.files if entry.name not in names]
    volume = _peer_files(rest, peers, index, targets.views)
    try:
        read_files(path, volume, index, targets.views, engine.read_threads, engine.policy)
    except CorruptCheckpointError as exc:
        return f"step {manifest.step}'s other slices on the volume: {exc}"
    targets.finish()
    # the checkpoint's structure, not ``into``'s: a live state may hold what the checkpoint
    # has not (an optimizer's moments from steps after it), which must not survive a restore
    return targets.state(manifest), sum(entry.size for entry in volume), targets.pinned_bytes


def _restore_sharded(
    engine: CheckpointEngine,
    path: Path,
    manifest: Manifest,
    into: Any,
    own: tuple[SavePlan, torch.Tensor] | None,
    peers: list[PeerSegment],
) -> tuple[Any, int, int] | str:
    """A sharded checkpoint into the template's shards, each saving rank's ranges from host
    memory where it holds them intact; returns the state, memory and volume bytes."""
    sources: dict[int, list[StreamSource]] = {}
    if own is not None and own[0].dp_world == manifest.dp_world:
        plan, data = own
        sources[plan.dp_rank] = [BufferSource(data, plan.slice_start, plan.slice_bytes)]
    for peer in peers:
        if peer.header.dp_world == manifest.dp_world:
            sources.setdefault(peer.header.dp_rank, []).append(peer)
    try:
        loaded = load_shards(
            path, manifest, into=into, sources=sources, io_threads=engine.read_threads
        )
    except (CorruptCheckpointError, TreeError) as exc:
        return f"step {manifest.step}'s shards: {exc}"
    return loaded.state, loaded.memory_bytes, loaded.volume_bytes


def restore_from_host(
    engine: CheckpointEngine, step: int, into: Any, *, own: bool = True, merge: bool = False
) -> HostRestore | str:
    """Load ``step`` from host memory where it is held intact (with ``own``, this rank's
    buffer: only a process that saved it and restarted in process has one; the node's
    segments in any case), the rest from the volume; a string says why not (nothing of the
    step in memory, or a bad byte: the caller restores from the volume alone). Tensors of
    ``into`` (DTensors: their local shards) are filled in place; the state returned has
    exactly the checkpoint's structure (``merge``: ``into`` updated, as a cold restore's)."""
    started = time.perf_counter()
    snapshot = engine.host_snapshot(step) if own else None
    path = step_dir(engine.root, step)
    try:
        manifest = read_manifest(path)
        if manifest.kind not in (KIND_ENGINE, KIND_SHARDED) or manifest.step != step:
            return f"step {step}'s manifest is not the engine's checkpoint of that step"
        sharded = manifest.kind == KIND_SHARDED
    except (ManifestError, OSError, ValueError) as exc:
        return f"step {step}'s manifest: {exc}"
    with engine.node_peers(step, sharded=sharded) as peers:
        if snapshot is None and not peers:
            return f"step {step} is no longer in host memory"
        if sharded:
            outcome = _restore_sharded(engine, path, manifest, into, snapshot, peers)
            if isinstance(outcome, str):
                return outcome
            state, memory, volume = outcome
            pinned = 0  # its GPU copies are from pageable staging
        else:
            plain = _restore_plain(engine, path, manifest, into, snapshot, peers)
            if isinstance(plain, str):
                return plain
            state, volume, pinned = plain
            memory = sum(entry.size for entry in manifest.files) - volume
    if merge and into is not None:
        state = merge_into(into, state)
    return HostRestore(
        step,
        state,
        memory + volume,
        time.perf_counter() - started,
        host_bytes=memory,
        pinned_bytes=pinned,
    )
