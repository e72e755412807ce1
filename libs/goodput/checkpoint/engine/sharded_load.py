"""Restoring a sharded checkpoint under any world size or mesh, reading only what is needed.

Each tensor to fill is a box of its global tensor: a DTensor target's local shard (wherever
its new mesh and placements put it), or the whole tensor for a plain target or none (then a
full tensor is built: restoring FSDP2 state on one process without a mesh consolidates it).
``goodput.checkpoint.engine.reshard.plan_reads`` says which blocks of which saved shards overlap that box;
those byte ranges are read from the saving ranks' data files, each block checked against
its digest in the shard record, and the overlap copied into the target in place.

After an in-process restart the saving ranks' streams may still be in host memory (this
rank's buffer, its node-mates' segments: ``sources``); a range one of them holds is read from
there and checked against the same digests, and only a range no source holds intact is read
from the volume. A target whose box is the saved shard's (the mesh is unchanged) is read
straight into its bytes, with no staging copy.

A part of a checkpoint spanning nodes holds only its node's ranks' shards: a restore whose
boxes those cover (the same layout) reads nothing else; otherwise it plans again over the
parts staged beside it (``goodput.checkpoint.engine.part_sources``), and fails naming the
parts it lacks.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import xxhash

from goodput.checkpoint.engine.buffers import byte_view
from goodput.checkpoint.engine.fileio import CorruptCheckpointError, DirectIOPolicy
from goodput.checkpoint.engine.load_into import bind_targets, merge_into
from goodput.checkpoint.engine.node_segments import StreamSource
from goodput.checkpoint.engine.part_sources import (
    SavedShards,
    lacking,
    missing_parts_line,
    staged_shards,
)
from goodput.checkpoint.engine.reshard import (
    Box,
    PieceRead,
    ReshardError,
    file_segments,
    plan_reads,
    row_major_strides,
)
from goodput.checkpoint.engine.sharded_save import is_dtensor, local_box
from goodput.checkpoint.engine.tree import dtype_from_name, unflatten
from goodput.checkpoint.format import Manifest, ManifestError, open_regular
from goodput.checkpoint.format.files import unreadable_reason
from goodput.checkpoint.format.sharded import (
    ShardPiece,
    ShardRecord,
    data_entries,
)
from goodput.checkpoint.format.sharded import read_records as records_of

#: one read's range at most (its staging buffer); larger overlaps are read in several
MAX_READ_BYTES = 64 << 20


def _read_exact(path: Path, offset: int, length: int, out: memoryview) -> None:
    try:
        fd = open_regular(path)
    except OSError as exc:
        raise CorruptCheckpointError(f"{path.name}: {unreadable_reason(exc)}") from exc
    try:
        got = 0
        while got < length:
            count = os.preadv(fd, [out[got:length]], offset + got)
            if count == 0:
                raise CorruptCheckpointError(f"{path.name}: short file")
            got += count
    finally:
        os.close(fd)


def read_records(path: Path, manifest: Manifest) -> list[ShardRecord]:
    """Every rank's shard record, checked (``format.sharded.read_records``); raises
    CorruptCheckpointError."""
    try:
        return records_of(path, manifest)
    except ManifestError as exc:
        raise CorruptCheckpointError(str(exc)) from exc


@dataclass(frozen=True)
class _Task:
    """One planned read: which saved shard (in which directory), which target, which bytes."""

    saved: SavedShards
    rank: int
    piece: ShardPiece
    read: PieceRead
    target: torch.Tensor
    target_box: Box
    dtype: torch.dtype


@dataclass(frozen=True)
class ShardedLoad:
    """A sharded restore: the state, and the data bytes read from memory and the volume."""

    state: Any
    memory_bytes: int
    volume_bytes: int


def _blocks_match(view: memoryview, task: _Task, block_bytes: int) -> int | None:
    """The first block of ``view`` that fails its digest, or None."""
    for index, lo in enumerate(range(0, len(view), block_bytes)):
        block = task.read.first_block + index
        if xxhash.xxh3_128_hexdigest(view[lo : lo + block_bytes]) != task.piece.blocks[block]:
            return block
    return None


def _read_volume(task: _Task, view: memoryview) -> None:
    piece, read, path = task.piece, task.read, task.saved.path
    files = [(e.name, e.offset, e.size) for e in data_entries(task.saved.manifest, task.rank)]
    try:
        segments = file_segments(
            piece.stream_offset + read.byte_lo, piece.stream_offset + read.byte_hi, files
        )
    except ReshardError as exc:
        raise CorruptCheckpointError(f"rank {task.rank}: {exc}") from exc
    for segment in segments:
        _read_exact(
            path / segment.name,
            segment.offset,
            segment.length,
            view[segment.dest : segment.dest + segment.length],
        )


def _run(task: _Task, block_bytes: int, sources: Sequence[StreamSource]) -> bool:
    """Fill the task's overlap from the first of ``sources`` that holds the bytes intact,
    else from the volume; True if from memory."""
    piece, read = task.piece, task.read
    saved = Box(tuple(piece.offsets), tuple(piece.shape))
    target = task.target
    # the same box as saved: the bytes read are the target's own, so they go straight in
    # (a chunk widened to whole blocks rewrites a neighbour chunk's bytes with the same
    # verified values, or with a bad source's, which that chunk's volume read then replaces)
    direct = saved == task.target_box and target.is_contiguous() and not target.is_cuda
    if direct:
        staging = byte_view(target.detach())[read.byte_lo : read.byte_hi]
    else:
        staging = torch.empty(read.byte_hi - read.byte_lo, dtype=torch.uint8)
    view = staging.numpy().data
    start = piece.stream_offset + read.byte_lo
    from_memory = any(
        source.covers(start, start + len(view))
        and source.read(start, view)
        and _blocks_match(view, task, block_bytes) is None
        for source in sources
    )
    if not from_memory:
        _read_volume(task, view)
        bad = _blocks_match(view, task, block_bytes)
        if bad is not None:
            raise CorruptCheckpointError(
                f"rank {task.rank}, tensor {piece.tensor}: block {bad} fails its checksum"
            )
    if not direct:
        itemsize = torch.empty((), dtype=task.dtype).element_size()
        source_view = staging.view(task.dtype).as_strided(
            read.overlap.shape,
            row_major_strides(piece.shape),
            read.element_offset(saved, itemsize),
        )
        index = tuple(
            slice(o - t, o - t + n)
            for o, t, n in zip(
                read.overlap.offsets, task.target_box.offsets, read.overlap.shape, strict=True
            )
        )
        with torch.no_grad():
            target[index].copy_(source_view)
    return from_memory


def _target(tensor: torch.Tensor) -> tuple[torch.Tensor, Box]:
    """The tensor to fill in place (outside autograd) and the box of the global tensor."""
    with torch.no_grad():
        if is_dtensor(tensor):
            return tensor.to_local(), local_box(tensor)
        return tensor, Box((0,) * tensor.dim(), tuple(tensor.shape))


def load_sharded(
    path: Path,
    manifest: Manifest,
    *,
    into: Any = None,
    io_threads: int = 4,
    policy: DirectIOPolicy | None = None,
    max_read_bytes: int = MAX_READ_BYTES,
    merge: bool = True,
) -> tuple[Any, int]:
    """Load a sharded checkpoint into ``into``'s tensors (DTensors: their local shards) or,
    for tensors it lacks, into new full tensors; returns the state and the data bytes read
    (this rank's regions, not the whole checkpoint). Raises CorruptCheckpointError on any bad
    byte, a missing rank's shards, or an incomplete cover of a needed region. ``policy`` is
    accepted for the engine's signature; these range reads go through the page cache.
    ``merge``: return ``into`` updated (else the checkpoint's own structure)."""
    del policy
    loaded = load_shards(
        path, manifest, into=into, io_threads=io_threads, max_read_bytes=max_read_bytes
    )
    state = merge_into(into, loaded.state) if merge and into is not None else loaded.state
    return state, loaded.memory_bytes + loaded.volume_bytes


def load_shards(
    path: Path,
    manifest: Manifest,
    *,
    into: Any = None,
    sources: Mapping[int, Sequence[StreamSource]] | None = None,
    io_threads: int = 4,
    max_read_bytes: int = MAX_READ_BYTES,
) -> ShardedLoad:
    """``load_sharded``'s work, each saving rank's bytes taken from the first of
    ``sources[rank]`` that holds them intact; the state has the checkpoint's structure
    (``into``'s tensors in it)."""
    sources = sources or {}
    own = SavedShards(path, manifest, read_records(path, manifest))
    count = len(manifest.tensors)
    targets: list[Any] = [None] * count
    skeleton = unflatten(manifest.tree, tensor_count=count)  # before allocating
    if into is not None:
        bind_targets(into, skeleton, manifest, targets)
    for index, entry in enumerate(manifest.tensors):
        if targets[index] is None:
            targets[index] = torch.empty(entry.shape, dtype=dtype_from_name(entry.dtype))
    boxes = [_target(target) for target in targets]
    try:
        tasks = _plan(manifest, [own], boxes, max_read_bytes)
    except ReshardError as exc:
        staged, missing = staged_shards(path, manifest)
        if not staged and not missing:
            raise CorruptCheckpointError(str(exc)) from exc
        readable = []
        for part in staged:
            try:
                part.records.extend(read_records(part.path, part.manifest))
                readable.append(part)
            except CorruptCheckpointError as bad:
                missing[part.index] = str(bad)
        try:
            tasks = _plan(manifest, [own, *readable], boxes, max_read_bytes)
        except ReshardError as again:
            if not missing:
                raise CorruptCheckpointError(str(again)) from again
            regions = [(box.offsets, box.shape) for _, box in boxes]
            lacks = lacking(manifest, own.records, regions, missing)
            raise CorruptCheckpointError(
                f"{again}: {missing_parts_line(manifest.step, lacks)}"
            ) from again
    block_bytes = own.records[0].block_bytes
    # largest reads first, so the pool ends together
    tasks.sort(key=lambda task: task.read.byte_hi - task.read.byte_lo, reverse=True)
    with ThreadPoolExecutor(max(1, min(io_threads, len(tasks) or 1))) as pool:
        futures = [
            pool.submit(_run, task, block_bytes, sources.get(task.rank, ())) for task in tasks
        ]
        errors = [error for future in futures if (error := future.exception()) is not None]
    if errors:
        raise errors[0]
    if any(target.is_cuda for target in targets):
        torch.cuda.synchronize()
    memory = volume = 0
    for task, future in zip(tasks, futures, strict=True):
        size = task.read.byte_hi - task.read.byte_lo
        memory, volume = (memory + size, volume) if future.result() else (memory, volume + size)
    return ShardedLoad(
        unflatten(manifest.tree, lambda i: targets[i], tensor_count=count), memory, volume
    )


def _plan(
    manifest: Manifest,
    saved: Sequence[SavedShards],
    boxes: Sequence[tuple[torch.Tensor, Box]],
    max_read_bytes: int,
) -> list[_Task]:
    """The reads filling every target box from the shards of ``saved`` (one block size
    throughout); raises ReshardError when they do not cover a box."""
    block_bytes = saved[0].records[0].block_bytes if saved[0].records else 1
    count = len(manifest.tensors)
    pieces: list[list[tuple[SavedShards, int, ShardPiece]]] = [[] for _ in range(count)]
    for where in saved:
        for record in where.records:
            if record.block_bytes != block_bytes:
                raise CorruptCheckpointError("ranks' shard records use different block sizes")
            for piece in record.pieces:
                if not 0 <= piece.tensor < count:
                    raise CorruptCheckpointError(f"rank {record.rank}: shard of unknown tensor")
                pieces[piece.tensor].append((where, record.rank, piece))
    tasks: list[_Task] = []
    for index, entry in enumerate(manifest.tensors):
        dtype = dtype_from_name(entry.dtype)
        local, box = boxes[index]
        itemsize = torch.empty((), dtype=dtype).element_size()
        try:
            reads = plan_reads(
                box,
                [Box(tuple(p.offsets), tuple(p.shape)) for _, _, p in pieces[index]],
                itemsize=itemsize,
                block_bytes=block_bytes,
                max_read_bytes=max_read_bytes,
            )
        except ReshardError as exc:
            raise ReshardError(f"tensor {index}: {exc}") from exc
        for read in reads:
            where, rank, piece = pieces[index][read.piece]
            tasks.append(_Task(where, rank, piece, read, local, box, dtype))
    return tasks
