"""Restoring a sharded checkpoint under any world size or mesh, reading only what is needed.

Each tensor to fill is a box of its global tensor: a DTensor target's local shard (wherever
its new mesh and placements put it), or the whole tensor for a plain target or none (then a
full tensor is built: restoring FSDP2 state on one process without a mesh consolidates it).
``goodput.checkpoint.engine.reshard.plan_reads`` says which blocks of which saved shards overlap that box;
those byte ranges are read from the saving ranks' data files, each block checked against
its digest in the shard record, and the overlap copied into the target in place.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import xxhash

from goodput.checkpoint.engine.fileio import CorruptCheckpointError, DirectIOPolicy
from goodput.checkpoint.engine.reshard import (
    Box,
    PieceRead,
    ReshardError,
    file_segments,
    plan_reads,
    row_major_strides,
)
from goodput.checkpoint.engine.restore import _bind_targets, _merge
from goodput.checkpoint.engine.sharded_save import is_dtensor, local_box
from goodput.checkpoint.engine.tree import dtype_from_name, unflatten
from goodput.checkpoint.format import Manifest, NotRegularFile, open_regular
from goodput.checkpoint.format.sharded import (
    MAX_RECORD_BYTES,
    ShardPiece,
    ShardRecord,
    check_record_layout,
    data_entries,
    parse_record,
    record_entries,
)

#: one read's range at most (its staging buffer); larger overlaps are read in several
MAX_READ_BYTES = 64 << 20


def _read_exact(path: Path, offset: int, length: int, out: memoryview) -> None:
    try:
        fd = open_regular(path)
    except FileNotFoundError as exc:
        raise CorruptCheckpointError(f"{path.name}: missing") from exc
    except NotRegularFile as exc:
        raise CorruptCheckpointError(f"{path.name}: not a regular file") from exc
    except OSError as exc:
        raise CorruptCheckpointError(f"{path.name}: unreadable ({exc.strerror or exc})") from exc
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
    """Every rank's shard record, each checked against its manifest entry and its layout
    against the data files' sealed sizes (before anything is allocated)."""
    records = []
    for entry in record_entries(manifest):
        if entry.size > MAX_RECORD_BYTES:
            raise CorruptCheckpointError(f"{entry.name}: implausibly large ({entry.size} bytes)")
        data = bytearray(entry.size)
        _read_exact(path / entry.name, 0, entry.size, memoryview(data))
        record = parse_record(bytes(data), entry, manifest.dp_world)
        check_record_layout(record, manifest)
        records.append(record)
    return records


@dataclass(frozen=True)
class _Task:
    """One planned read: which saved shard, which target, which bytes."""

    rank: int
    piece: ShardPiece
    read: PieceRead
    target: torch.Tensor
    target_box: Box
    dtype: torch.dtype


def _run(path: Path, manifest: Manifest, task: _Task, block_bytes: int) -> None:
    piece, read = task.piece, task.read
    start = piece.stream_offset + read.byte_lo
    files = [(e.name, e.offset, e.size) for e in data_entries(manifest, task.rank)]
    try:
        segments = file_segments(start, piece.stream_offset + read.byte_hi, files)
    except ReshardError as exc:
        raise CorruptCheckpointError(f"rank {task.rank}: {exc}") from exc
    staging = torch.empty(read.byte_hi - read.byte_lo, dtype=torch.uint8)
    view = memoryview(staging.numpy())
    for segment in segments:
        _read_exact(
            path / segment.name,
            segment.offset,
            segment.length,
            view[segment.dest : segment.dest + segment.length],
        )
    for index, lo in enumerate(range(0, len(view), block_bytes)):
        block = read.first_block + index
        if xxhash.xxh3_128_hexdigest(view[lo : lo + block_bytes]) != piece.blocks[block]:
            raise CorruptCheckpointError(
                f"rank {task.rank}, tensor {piece.tensor}: block {block} fails its checksum"
            )
    saved = Box(tuple(piece.offsets), tuple(piece.shape))
    itemsize = torch.empty((), dtype=task.dtype).element_size()
    source = staging.view(task.dtype).as_strided(
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
        task.target[index].copy_(source)


def _target(tensor: torch.Tensor) -> tuple[torch.Tensor, Box]:
    """The tensor to fill in place (outside autograd) and the box of the global tensor."""
    with torch.no_grad():
        if is_dtensor(tensor):
            return tensor.to_local(), local_box(tensor)  # type: ignore[attr-defined]
        return tensor, Box((0,) * tensor.dim(), tuple(tensor.shape))


def load_sharded(
    path: Path,
    manifest: Manifest,
    *,
    into: Any = None,
    io_threads: int = 4,
    policy: DirectIOPolicy | None = None,
    max_read_bytes: int = MAX_READ_BYTES,
) -> tuple[Any, int]:
    """Load a sharded checkpoint into ``into``'s tensors (DTensors: their local shards) or,
    for tensors it lacks, into new full tensors; returns the state and the data bytes read
    (this rank's regions, not the whole checkpoint). Raises CorruptCheckpointError on any bad
    byte, a missing rank's shards, or an incomplete cover of a needed region. ``policy`` is
    accepted for the engine's signature; these range reads go through the page cache."""
    del policy
    try:
        records = read_records(path, manifest)
    except ValueError as exc:  # ManifestError included
        raise CorruptCheckpointError(str(exc)) from exc
    count = len(manifest.tensors)
    pieces: list[list[tuple[int, ShardPiece]]] = [[] for _ in range(count)]
    for record in records:
        for piece in record.pieces:
            if not 0 <= piece.tensor < count:
                raise CorruptCheckpointError(f"rank {record.rank}: shard of unknown tensor")
            pieces[piece.tensor].append((record.rank, piece))
    targets: list[Any] = [None] * count
    skeleton = unflatten(manifest.tree, tensor_count=count)  # before allocating
    if into is not None:
        _bind_targets(into, skeleton, manifest, targets)
    block_bytes = records[0].block_bytes
    if any(record.block_bytes != block_bytes for record in records):
        raise CorruptCheckpointError("ranks' shard records use different block sizes")
    tasks: list[_Task] = []
    for index, entry in enumerate(manifest.tensors):
        dtype = dtype_from_name(entry.dtype)
        if targets[index] is None:
            targets[index] = torch.empty(entry.shape, dtype=dtype)
        local, box = _target(targets[index])
        saved = [Box(tuple(p.offsets), tuple(p.shape)) for _, p in pieces[index]]
        itemsize = torch.empty((), dtype=dtype).element_size()
        try:
            reads = plan_reads(
                box,
                saved,
                itemsize=itemsize,
                block_bytes=block_bytes,
                max_read_bytes=max_read_bytes,
            )
        except ReshardError as exc:
            raise CorruptCheckpointError(f"tensor {index}: {exc}") from exc
        for read in reads:
            rank, piece = pieces[index][read.piece]
            tasks.append(_Task(rank, piece, read, local, box, dtype))
    # largest reads first, so the pool ends together
    tasks.sort(key=lambda task: task.read.byte_hi - task.read.byte_lo, reverse=True)
    with ThreadPoolExecutor(max(1, min(io_threads, len(tasks) or 1))) as pool:
        futures = [pool.submit(_run, path, manifest, task, block_bytes) for task in tasks]
        errors = [exc for future in futures if (exc := future.exception()) is not None]
    if errors:
        raise errors[0]
    if any(target.is_cuda for target in targets):
        torch.cuda.synchronize()
    restored = unflatten(manifest.tree, lambda i: targets[i], tensor_count=count)
    read = sum(task.read.byte_hi - task.read.byte_lo for task in tasks)
    return (restored if into is None else _merge(into, restored)), read
