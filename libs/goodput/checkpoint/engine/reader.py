"""Reading one data file for a restore: pipelined, straight into the tensors, every byte hashed.

A file is read front to back in segments; while one segment is hashed (xxh3_128, in file
order), the next is already being read on a prefetch thread, so the disk always has a request
of this file in flight; the restore reads several files at once.

Buffered reads (the default, see ``goodput.checkpoint.engine.fileio``) are ``READ_CHUNK_BYTES`` chunks,
each one ``preadv`` scattering straight into the target tensors' slices; the bytes no tensor
takes (alignment padding, skipped tensors) land in one of two reused staging buffers.

O_DIRECT reads (``direct_io=True``) need page alignment. Where a tensor's bytes lie in memory
at the same offset modulo the page size as in the file (always for tensors the restore
allocates itself, by chance for tensors loaded in place), the page-aligned middle of that
tensor is one segment read straight into it. Everything else is read in chunks into the
staging buffers and scattered into the tensors.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
import xxhash

from goodput.checkpoint.engine.fileio import (
    CorruptCheckpointError,
    DirectIOPolicy,
    hash_in_slices,
    open_for_read,
)
from goodput.checkpoint.engine.plan import IO_ALIGN, StreamIndex, align_up
from goodput.checkpoint.format import FileEntry
from goodput.checkpoint.format.files import unreadable_reason

READ_CHUNK_BYTES = 32 << 20
#: a tensor piece shorter than this is staged: a separate request would cost more than a copy
MIN_DIRECT_BYTES = 1 << 20
#: preadv takes at most this many buffers per call (IOV_MAX on Linux)
_IOV_MAX = 1024


@dataclass(frozen=True)
class Segment:
    """File bytes ``[start, start + size)``; ``target`` receives them directly (else staged)."""

    start: int
    size: int
    target: torch.Tensor | None = None


def plan_segments(
    entry: FileEntry, index: StreamIndex, targets: list[torch.Tensor | None], direct: bool
) -> list[Segment]:
    """Segments tiling the file: direct reads into congruent tensors, staged chunks between."""
    parts: list[Segment] = []
    if direct:
        for tensor_index, lo, hi in index.overlapping(entry.offset, entry.offset + entry.size):
            target = targets[tensor_index]
            if target is None:
                continue
            at = index.entries[tensor_index].offset + lo - entry.offset
            first, last = align_up(at, IO_ALIGN), (at + hi - lo) // IO_ALIGN * IO_ALIGN
            begin = lo + first - at
            if last - first >= MIN_DIRECT_BYTES and (target.data_ptr() + begin) % IO_ALIGN == 0:
                parts.append(Segment(first, last - first, target[begin : begin + last - first]))
    segments: list[Segment] = []
    position = 0
    for part in [*parts, Segment(entry.size, 0)]:
        while position < part.start:
            count = min(READ_CHUNK_BYTES, part.start - position)
            segments.append(Segment(position, count))
            position += count
        if part.size:
            segments.append(part)
            position = part.start + part.size
    return segments


def _pread_full(fd: int, views: list[memoryview], offset: int) -> int:
    """Read into ``views`` in order until all are full or end of file; returns the count read."""
    got, first = 0, 0
    views = list(views)
    while first < len(views):
        count = os.preadv(fd, views[first : first + _IOV_MAX], offset + got)
        if count == 0:
            break
        got += count
        while first < len(views) and count >= len(views[first]):
            count -= len(views[first])
            first += 1
        if count:
            views[first] = views[first][count:]
    return got


def _landing(
    segment: Segment,
    staging: torch.Tensor,
    direct: bool,
    index: StreamIndex,
    targets: list[torch.Tensor | None],
    stream_start: int,
) -> list[memoryview]:
    """Where a segment's bytes are read to, in file order.

    O_DIRECT: the target tensor, or a page-aligned, padded view of ``staging`` to scatter from.
    Buffered: straight into each target tensor's slice, with the bytes no tensor takes
    (padding, skipped tensors) laid one after another in ``staging``.
    """
    if segment.target is not None:
        return [segment.target.numpy().data]
    spare = staging.numpy().data
    if direct:
        return [spare[: align_up(segment.size, IO_ALIGN)]]
    views: list[memoryview] = []
    position, end, used = stream_start, stream_start + segment.size, 0
    for tensor_index, lo, hi in index.overlapping(position, end):
        target = targets[tensor_index]
        begin = index.entries[tensor_index].offset + lo
        if target is None or hi == lo:
            continue
        if begin > position:
            views.append(spare[used : used + begin - position])
            used += begin - position
        views.append(target[lo:hi].numpy().data)
        position = begin + hi - lo
    if position < end:
        views.append(spare[used : used + end - position])
    return views


def _read(
    path: Path,
    entry: FileEntry,
    index: StreamIndex,
    targets: list[torch.Tensor | None],
    stagings: tuple[torch.Tensor, torch.Tensor],
    prefetch: ThreadPoolExecutor,
    direct: bool,
) -> None:
    fd = open_for_read(path, direct)
    pending: Future[int] | None = None
    try:
        actual = os.fstat(fd).st_size
        if actual != entry.size:
            raise CorruptCheckpointError(f"{path.name}: size {actual} != {entry.size} in manifest")
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        segments = plan_segments(entry, index, targets, direct)
        views = [
            _landing(s, stagings[k % 2], direct, index, targets, entry.offset + s.start)
            for k, s in enumerate(segments)
        ]
        hasher = xxhash.xxh3_128()
        if segments:
            pending = prefetch.submit(_pread_full, fd, views[0], segments[0].start)
        for k, segment in enumerate(segments):
            assert pending is not None
            got, pending = pending.result(), None
            if k + 1 < len(segments):
                pending = prefetch.submit(_pread_full, fd, views[k + 1], segments[k + 1].start)
            if got < segment.size:
                raise CorruptCheckpointError(f"{path.name}: short file ({segment.start + got} B)")
            _hash_views(hasher, views[k], segment.size)
            if direct and segment.target is None:
                _scatter(
                    index, targets, stagings[k % 2], entry.offset + segment.start, segment.size
                )
        if not direct:  # the restored bytes live in the tensors now: leave the cache to training
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        if pending is not None:  # never close the descriptor under a read still running
            pending.exception()
        os.close(fd)
    if hasher.hexdigest() != entry.xxh3_128:
        raise CorruptCheckpointError(f"{path.name}: xxh3_128 mismatch")


def _hash_views(hasher: xxhash.xxh3_128, views: list[memoryview], size: int) -> None:
    """Hash the first ``size`` bytes of ``views`` (an O_DIRECT landing is padded past them)."""
    for view in views:
        hash_in_slices(hasher, view[:size])
        size -= min(size, len(view))


def _scatter(
    index: StreamIndex,
    targets: list[torch.Tensor | None],
    staging: torch.Tensor,
    stream_start: int,
    count: int,
) -> None:
    for tensor_index, lo, hi in index.overlapping(stream_start, stream_start + count):
        target = targets[tensor_index]
        if target is not None:
            source = index.entries[tensor_index].offset + lo - stream_start
            target[lo:hi].copy_(staging[source : source + hi - lo])


def read_data_file(
    path: Path,
    entry: FileEntry,
    index: StreamIndex,
    targets: list[torch.Tensor | None],
    stagings: tuple[torch.Tensor, torch.Tensor],
    prefetch: ThreadPoolExecutor,
    policy: DirectIOPolicy,
) -> None:
    """Read one data file, verify its digest, and leave its bytes in the tensor byte views.

    ``targets[i]`` is tensor i's flat uint8 view (None to skip). ``stagings`` are two
    page-aligned uint8 tensors of at least READ_CHUNK_BYTES; ``prefetch`` runs the read ahead.
    Raises CorruptCheckpointError on any mismatch; targets may then hold partial data.
    """
    try:
        _read(path, entry, index, targets, stagings, prefetch, policy.wanted_for_reads)
    except OSError as exc:
        raise CorruptCheckpointError(f"{path.name}: {unreadable_reason(exc)}") from exc
