"""Reading one data file for a restore: O_DIRECT, pipelined, straight into the tensors.

A file is read front to back as a list of segments. Where a tensor's bytes lie in memory at
the same offset modulo the page size as in the file (always for tensors the restore
allocates itself, by chance for tensors loaded in place), the page-aligned middle of that
tensor is one segment read with O_DIRECT straight into the tensor: no intermediate copy.
Everything else is read in ``READ_CHUNK_BYTES`` chunks into one of two reused, page-aligned
staging buffers and scattered into the tensors. While one segment is hashed (xxh3_128, in file
order) and scattered, the next one is already being read on a prefetch thread, so the disk
always has a request of this file in flight; the restore reads several files at once.
O_DIRECT falls back to buffered reads where the filesystem refuses it (``DirectIOPolicy``:
tmpfs, for one, answers EINVAL); buffered reads take the same segments into staging.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
import xxhash

from goodput.ckpt.fileio import (
    CorruptCheckpointError,
    DirectIOPolicy,
    hash_in_slices,
    open_for_read,
)
from goodput.ckpt.plan import IO_ALIGN, StreamIndex, align_up
from goodput.ckptfmt import FileEntry, NotRegularFile

READ_CHUNK_BYTES = 32 << 20
#: a tensor piece shorter than this is staged: a separate request would cost more than a copy
MIN_DIRECT_BYTES = 1 << 20


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


def _pread_full(fd: int, view: memoryview, offset: int) -> int:
    """Read until ``view`` is full or end of file; returns the count read."""
    got = 0
    while got < len(view):
        count = os.preadv(fd, [view[got:]], offset + got)
        if count == 0:
            break
        got += count
    return got


def _landing(segment: Segment, staging: torch.Tensor) -> memoryview:
    """Where a segment's bytes are read to (for O_DIRECT: a page-aligned, padded view)."""
    if segment.target is not None:
        return memoryview(segment.target.numpy())
    return memoryview(staging.numpy())[: align_up(segment.size, IO_ALIGN)]


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
        views = [_landing(s, stagings[k % 2]) for k, s in enumerate(segments)]
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
            hash_in_slices(hasher, views[k][: segment.size])
            if segment.target is None:
                _scatter(
                    index, targets, stagings[k % 2], entry.offset + segment.start, segment.size
                )
    finally:
        if pending is not None:  # never close the descriptor under a read still running
            pending.exception()
        os.close(fd)
    if hasher.hexdigest() != entry.xxh3_128:
        raise CorruptCheckpointError(f"{path.name}: xxh3_128 mismatch")


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
        if policy.wanted:
            try:
                _read(path, entry, index, targets, stagings, prefetch, direct=True)
                return
            except NotRegularFile:
                raise
            except OSError as exc:
                if not policy.refused(exc):
                    raise
        _read(path, entry, index, targets, stagings, prefetch, direct=False)
    except FileNotFoundError as exc:
        raise CorruptCheckpointError(f"{path.name}: missing") from exc
    except NotRegularFile as exc:
        raise CorruptCheckpointError(f"{path.name}: not a regular file") from exc
    except OSError as exc:
        raise CorruptCheckpointError(f"{path.name}: unreadable ({exc.strerror or exc})") from exc
