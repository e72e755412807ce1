"""Which bytes a rank reads to fill its shard of a tensor from shards saved under another layout.

Pure functions (no torch, no IO), so the planning is tested on its own. A shard is a box of a
global tensor (offsets and shape per dimension) stored row-major and contiguous. For a target
box (the restoring rank's local shard), every saved box that overlaps it contributes the
overlap; the bytes read from a saved shard are the span from the overlap's first to its last
element, widened to the shard's digest blocks so every byte used is verified. Under a
``Shard(0)``-style layout that span is exactly the rows needed; under other placements it may
include rows in between (still only blocks of the overlapping shards).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


class ReshardError(ValueError):
    """The saved shards do not tile the requested region, or a file range is missing."""


@dataclass(frozen=True)
class Box:
    """A region of a tensor: ``offsets[d] <= index[d] < offsets[d] + shape[d]``."""

    offsets: tuple[int, ...]
    shape: tuple[int, ...]

    @property
    def volume(self) -> int:
        return math.prod(self.shape)


def intersect(a: Box, b: Box) -> Box | None:
    """The common region of two boxes of the same tensor, or None when they share nothing."""
    if len(a.offsets) != len(b.offsets):
        raise ReshardError(f"boxes of rank {len(a.offsets)} and {len(b.offsets)}")
    lo = tuple(max(x, y) for x, y in zip(a.offsets, b.offsets, strict=True))
    hi = tuple(
        min(x + n, y + m) for x, n, y, m in zip(a.offsets, a.shape, b.offsets, b.shape, strict=True)
    )
    if any(h <= low for low, h in zip(lo, hi, strict=True)):
        return None
    return Box(lo, tuple(h - low for low, h in zip(lo, hi, strict=True)))


def row_major_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * shape[d + 1]
    return tuple(strides)


@dataclass(frozen=True)
class PieceRead:
    """Read bytes ``[byte_lo, byte_hi)`` of saved shard ``piece`` (blocks ``first_block``…)
    and copy its ``overlap`` (global coordinates) into the target."""

    piece: int
    overlap: Box
    byte_lo: int
    byte_hi: int
    first_block: int

    def element_offset(self, saved: Box, itemsize: int) -> int:
        """Index of the overlap's first element among the elements read."""
        strides = row_major_strides(saved.shape)
        rel = [o - s for o, s in zip(self.overlap.offsets, saved.offsets, strict=True)]
        first = sum(r * st for r, st in zip(rel, strides, strict=True))
        return first - self.byte_lo // itemsize


def _byte_span(overlap: Box, saved: Box, itemsize: int) -> tuple[int, int]:
    """Bytes of ``saved`` (row-major) from the overlap's first element to past its last."""
    strides = row_major_strides(saved.shape)
    first = sum(
        (o - s) * st for o, s, st in zip(overlap.offsets, saved.offsets, strides, strict=True)
    )
    last = sum(
        (o + n - 1 - s) * st
        for o, n, s, st in zip(overlap.offsets, overlap.shape, saved.offsets, strides, strict=True)
    )
    return first * itemsize, (last + 1) * itemsize


def _chunks(overlap: Box, saved: Box, itemsize: int, max_read_bytes: int | None) -> list[Box]:
    """The overlap cut along its first dimension so that each piece spans about
    ``max_read_bytes`` of the saved shard (a single slice along it is never cut further)."""
    if max_read_bytes is None or not overlap.shape or overlap.volume == 0:
        return [overlap]
    slice_bytes = math.prod(saved.shape[1:]) * itemsize
    step = max(1, max_read_bytes // max(slice_bytes, 1))
    first, rest = overlap.shape[0], overlap.shape[1:]
    return [
        Box((overlap.offsets[0] + lo, *overlap.offsets[1:]), (min(step, first - lo), *rest))
        for lo in range(0, first, step)
    ]


def plan_reads(
    target: Box,
    saved: Sequence[Box],
    *,
    itemsize: int,
    block_bytes: int,
    max_read_bytes: int | None = None,
) -> list[PieceRead]:
    """The reads that fill ``target`` from the ``saved`` shards of one tensor; with
    ``max_read_bytes`` a large overlap is read in several pieces (bounded staging memory,
    and more reads to run in parallel), each widened to whole blocks on its own.

    Identical boxes are copies of one shard (saved by each rank holding a replica): the
    first is read. Raises ReshardError unless the overlapping shards cover ``target`` exactly
    once (a missing rank's shards, or two different shards claiming the same elements).
    """
    if block_bytes % itemsize:
        raise ReshardError(f"block size {block_bytes} is not a multiple of {itemsize}")
    reads: list[PieceRead] = []
    overlaps: list[Box] = []
    seen: set[Box] = set()
    for index, box in enumerate(saved):
        if box in seen:
            continue
        seen.add(box)
        overlap = intersect(target, box)
        if overlap is None or overlap.volume == 0:
            continue
        for chunk in _chunks(overlap, box, itemsize, max_read_bytes):
            lo, hi = _byte_span(chunk, box, itemsize)
            first_block = lo // block_bytes
            end = min(-(-hi // block_bytes) * block_bytes, box.volume * itemsize)
            reads.append(PieceRead(index, chunk, first_block * block_bytes, end, first_block))
        overlaps.append(overlap)
    for i, a in enumerate(overlaps):
        for b in overlaps[i + 1 :]:
            common = intersect(a, b)
            if common is not None and common.volume:
                raise ReshardError(f"two saved shards both hold {common}")
    covered = sum(box.volume for box in overlaps)
    if covered != target.volume:
        raise ReshardError(f"saved shards cover {covered} of the {target.volume} elements needed")
    return reads


@dataclass(frozen=True)
class Segment:
    """Bytes ``[offset, offset + length)`` of file ``name`` land at ``dest`` of the read."""

    name: str
    offset: int
    length: int
    dest: int


def file_segments(start: int, end: int, files: Sequence[tuple[str, int, int]]) -> list[Segment]:
    """Where stream bytes ``[start, end)`` of one rank are: ``files`` are (name, stream offset,
    size) of that rank's data files. Raises ReshardError if some byte is in no file."""
    segments = []
    position = start
    for name, offset, size in sorted(files, key=lambda f: f[1]):
        if offset + size <= position or offset >= end:
            continue
        if offset > position:
            break
        length = min(end, offset + size) - position
        segments.append(Segment(name, position - offset, length, position - start))
        position += length
        if position == end:
            return segments
    if position < end:
        raise ReshardError(f"stream bytes [{position}, {end}) are in no data file")
    return segments
