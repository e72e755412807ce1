"""Restore from host memory: the engine's buffer still holds the snapshot it persisted.

A rank restarting in process kept its memory, so reading its checkpoint back from the volume
is wasted time. The bytes come from the buffer instead, checked against the committed
manifest's per-file xxh3_128 (the manifest itself verified as on any restore), so a buffer
that does not hold exactly what was committed is never loaded: the caller falls back to the
volume.

Ranks that share a node's volume split each checkpoint among them (``dp_world`` > 1, one
contiguous slice of the byte stream each, ``goodput.checkpoint.engine.plan``), so a rank's buffer holds
only its slice: that slice comes from memory and the other ranks' data files are read from
the volume, verified as on a cold restore. The manifest is committed only once every rank's
files are written, so the volume holds them all, including the slice of a rank that died.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
import xxhash

from goodput.checkpoint.engine.engine import CheckpointEngine
from goodput.checkpoint.engine.fileio import CorruptCheckpointError
from goodput.checkpoint.engine.plan import SavePlan, StreamIndex
from goodput.checkpoint.engine.restore import prepare_targets, read_files
from goodput.checkpoint.format import (
    KIND_ENGINE,
    FileEntry,
    Manifest,
    ManifestError,
    read_manifest,
    step_dir,
)


@dataclass(frozen=True)
class HostRestore:
    """A restore from host memory: the step, the state loaded, its size and duration.

    ``host_bytes`` came from this rank's buffer, the rest of ``bytes`` from the volume (the
    other ranks' slices)."""

    step: int
    state: Any
    bytes: int
    duration_s: float
    host_bytes: int

    @property
    def volume_bytes(self) -> int:
        return self.bytes - self.host_bytes


def _in_memory(manifest: Manifest, plan: SavePlan, data: torch.Tensor) -> list[FileEntry] | str:
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
    if not mine:
        return f"host memory holds none of the {manifest.stream_bytes} bytes"
    view = memoryview(data.numpy())
    for entry in mine:
        start = entry.offset - plan.slice_start
        if xxhash.xxh3_128_hexdigest(view[start : start + entry.size]) != entry.xxh3_128:
            return f"{entry.name}: the buffer does not match the committed checksum"
    return mine


def _scatter(
    index: StreamIndex,
    views: list[torch.Tensor | None],
    data: torch.Tensor,
    base: int,
    entry: FileEntry,
) -> None:
    """Copy one file's bytes from the buffer (stream offset ``base`` at its start) into the
    tensors' byte views."""
    for tensor_index, lo, hi in index.overlapping(entry.offset, entry.offset + entry.size):
        view = views[tensor_index]
        if view is not None:
            start = index.entries[tensor_index].offset + lo - base
            view[lo:hi].copy_(data[start : start + hi - lo])


def restore_from_host(engine: CheckpointEngine, step: int, into: Any) -> HostRestore | str:
    """Load ``step``: this rank's slice from the engine's host buffer, the rest from the
    volume; a string says why not (the caller restores from the volume alone). Tensors of
    ``into`` with the checkpoint's shape and dtype are filled in place; the state returned
    has exactly the checkpoint's structure."""
    started = time.perf_counter()
    snapshot = engine.host_snapshot(step)
    if snapshot is None:
        return f"step {step} is no longer in host memory"
    plan, data = snapshot
    path = step_dir(engine.root, step)
    try:
        manifest = read_manifest(path)
        # a sharded checkpoint's buffer holds one rank's shards: the volume serves it
        if manifest.kind != KIND_ENGINE or manifest.step != step:
            return f"step {step}'s manifest is not the engine's checkpoint of that step"
    except (ManifestError, OSError, ValueError) as exc:
        return f"step {step}'s manifest: {exc}"
    mine = _in_memory(manifest, plan, data)
    if isinstance(mine, str):
        return mine
    index = StreamIndex(manifest.tensors)
    # tensors wholly in the slice are copied from the buffer in one piece: straight into a
    # contiguous target, even on a GPU (no staging)
    whole = frozenset(
        i
        for i, t in enumerate(manifest.tensors)
        if plan.slice_start <= t.offset and t.offset + t.nbytes <= plan.slice_end
    )
    targets = prepare_targets(manifest, into, engine.policy, whole=whole)
    for entry in mine:
        _scatter(index, targets.views, data, plan.slice_start, entry)
    names = {entry.name for entry in mine}
    rest = [entry for entry in manifest.files if entry.name not in names]
    try:
        read_files(path, rest, index, targets.views, engine.read_threads, engine.policy)
    except CorruptCheckpointError as exc:
        return f"step {step}'s other slices on the volume: {exc}"
    targets.finish()
    # the checkpoint's structure, not ``into``'s: a live state may hold what the checkpoint
    # has not (an optimizer's moments from steps after it), which must not survive a restore
    return HostRestore(
        step,
        targets.state(manifest),
        sum(entry.size for entry in manifest.files),
        time.perf_counter() - started,
        host_bytes=sum(entry.size for entry in mine),
    )
