"""Where each byte of a checkpoint goes: tensor offsets, DP slices and data files.

All tensors are packed, in visiting order, into one logical byte stream. Data files are
consecutive ranges of that stream, so a restore is a sequential read of each file scattered
into tensors. With ``dp_world`` identical replicas the stream is cut into ``dp_world``
contiguous slices and replica ``r`` writes only slice ``r``. Every replica computes the same
plan from the same state, which is what lets them split the work without talking.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass

import torch
import xxhash

from goodput.checkpoint.engine.tree import dtype_name
from goodput.checkpoint.format import TensorEntry

TENSOR_ALIGN = 64
IO_ALIGN = 4096
MIN_FILE_BYTES = 32 << 20


def align_up(value: int, alignment: int) -> int:
    return (value + alignment - 1) // alignment * alignment


@dataclass(frozen=True)
class FileRange:
    """One data file: stream bytes ``[start, end)``."""

    name: str
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class SavePlan:
    tensors: list[TensorEntry]
    stream_bytes: int
    dp_rank: int
    dp_world: int
    slice_start: int
    slice_end: int
    files: list[FileRange]
    layout_digest: str

    @property
    def slice_bytes(self) -> int:
        return self.slice_end - self.slice_start


def tensor_nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def _split(start: int, end: int, parts: int, min_bytes: int) -> list[tuple[int, int]]:
    """Cut ``[start, end)`` into up to ``parts`` IO-aligned ranges of at least ``min_bytes``."""
    size = end - start
    if size <= 0:
        return []
    parts = max(1, min(parts, size // max(min_bytes, 1)))
    step = align_up(-(-size // parts), IO_ALIGN)
    bounds = [start + i * step for i in range(parts) if start + i * step < end] + [end]
    return list(itertools.pairwise(bounds))


def make_plan(
    tensors: list[torch.Tensor],
    *,
    dp_rank: int = 0,
    dp_world: int = 1,
    files_per_rank: int = 4,
    min_file_bytes: int = MIN_FILE_BYTES,
) -> SavePlan:
    if not 0 <= dp_rank < dp_world:
        raise ValueError(f"dp_rank {dp_rank} outside dp_world {dp_world}")
    entries: list[TensorEntry] = []
    offset = 0
    for tensor in tensors:
        nbytes = tensor_nbytes(tensor)
        entries.append(
            TensorEntry(
                dtype=dtype_name(tensor.dtype),
                shape=list(tensor.shape),
                offset=offset,
                nbytes=nbytes,
            )
        )
        offset = align_up(offset + nbytes, TENSOR_ALIGN)
    stream_bytes = offset
    slices = _split(0, stream_bytes, dp_world, 1)
    slices += [(stream_bytes, stream_bytes)] * (dp_world - len(slices))
    slice_start, slice_end = slices[dp_rank]
    files = [
        FileRange(name=f"data-r{dp_rank:05d}-{index:03d}.bin", start=start, end=end)
        for index, (start, end) in enumerate(
            _split(slice_start, slice_end, files_per_rank, min_file_bytes)
        )
    ]
    digest = xxhash.xxh3_64_hexdigest(
        repr((dp_world, stream_bytes, [(e.dtype, e.shape, e.offset) for e in entries])).encode()
    )
    return SavePlan(
        tensors=entries,
        stream_bytes=stream_bytes,
        dp_rank=dp_rank,
        dp_world=dp_world,
        slice_start=slice_start,
        slice_end=slice_end,
        files=files,
        layout_digest=digest,
    )


class StreamIndex:
    """Finds the tensors covering a stream range (tensors are sorted by offset)."""

    def __init__(self, entries: list[TensorEntry]) -> None:
        self.entries = entries
        self._starts = [entry.offset for entry in entries]

    def overlapping(self, start: int, end: int) -> list[tuple[int, int, int]]:
        """``(tensor index, first byte, end byte)`` in tensor coordinates for ``[start, end)``."""
        pieces = []
        index = max(bisect.bisect_right(self._starts, start) - 1, 0)
        while index < len(self.entries) and self.entries[index].offset < end:
            entry = self.entries[index]
            lo = max(start, entry.offset)
            hi = min(end, entry.offset + entry.nbytes)
            if lo < hi:
                pieces.append((index, lo - entry.offset, hi - entry.offset))
            index += 1
        return pieces
