"""Large sequential data-file writes with optional O_DIRECT and streaming xxh3_128 digests.

O_DIRECT skips the page cache: on this kind of storage the cache costs more CPU than the copy
it saves, and it keeps a multi-GB checkpoint from evicting the training job's own pages. It
needs aligned buffers, offsets and lengths; the last partial block is written padded and the
file truncated to its real size. "auto" falls back to buffered IO where the filesystem
refuses O_DIRECT (tmpfs, some network filesystems) and remembers that for the directory.

Reads (a restore) go through the page cache unless O_DIRECT is forced. An O_DIRECT read
into ordinary 4 KB-page memory reaches the device in requests of at most ``max_segments``
pages (254 here: 0.5 MB on average, measured from /sys/block/vda/stat), while readahead
fills large page-cache folios with requests of ``max_sectors_kb`` (4 MB). With several files
read at once, that made restores 1.11-1.21 s against 1.47-1.67 s for 2 GB (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path
from typing import Literal

import torch
import xxhash

from goodput.checkpoint.engine.plan import IO_ALIGN, align_up
from goodput.checkpoint.format import open_regular

WRITE_CHUNK_BYTES = 64 << 20
#: xxhash holds the GIL while it hashes (about 15 ms per 64 MB on a loaded core): fed in
#: slices this small, it hands the GIL back to the training thread every millisecond or so
HASH_SLICE_BYTES = 4 << 20
DirectMode = Literal["auto"] | bool
_O_DIRECT = getattr(os, "O_DIRECT", 0)


class CorruptCheckpointError(Exception):
    """A data file is short, unreadable or fails its checksum."""


class DirectIOPolicy:
    """Decides whether to use O_DIRECT, learning from the first refusal in "auto" mode."""

    def __init__(self, mode: DirectMode = "auto") -> None:
        if mode not in ("auto", True, False):
            raise ValueError(f"direct_io must be 'auto', True or False, not {mode!r}")
        self.mode = mode
        self._refused = _O_DIRECT == 0
        self._lock = threading.Lock()

    @property
    def wanted(self) -> bool:
        return self.mode is True or (self.mode == "auto" and not self._refused)

    @property
    def wanted_for_reads(self) -> bool:
        """Reads take O_DIRECT only when it is forced (``mode=True``), see the module doc."""
        return self.mode is True

    def refused(self, exc: OSError) -> bool:
        """True when ``exc`` means "no O_DIRECT here" and auto mode may fall back."""
        if self.mode != "auto" or exc.errno != errno.EINVAL:
            return False
        with self._lock:
            self._refused = True
        return True


def hash_in_slices(hasher: xxhash.xxh3_128, view: memoryview) -> None:
    """``hasher.update(view)`` in ``HASH_SLICE_BYTES`` slices (the same digest)."""
    for start in range(0, len(view), HASH_SLICE_BYTES):
        hasher.update(view[start : start + HASH_SLICE_BYTES])


def open_for_write(path: Path, direct: bool) -> int:
    """A new (or truncated) file; with ``direct``, O_DIRECT (EINVAL where it is refused)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | (_O_DIRECT if direct else 0)
    return os.open(path, flags, 0o644)


def open_for_read(path: Path, direct: bool) -> int:
    """Only a regular file is data: a FIFO in its place would block the restore forever."""
    return open_regular(path, os.O_RDONLY | (_O_DIRECT if direct else 0))


def pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


def _write(path: Path, data: memoryview, size: int, direct: bool) -> str:
    fd = open_for_write(path, direct)
    try:
        hasher = xxhash.xxh3_128()
        position = 0
        while position < size:
            count = min(WRITE_CHUNK_BYTES, size - position)
            hash_in_slices(hasher, data[position : position + count])
            length = align_up(count, IO_ALIGN) if direct else count
            pwrite_all(fd, data[position : position + length], position)
            position += count
        if direct and size % IO_ALIGN:
            os.ftruncate(fd, size)
        os.fsync(fd)
        if not direct:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return hasher.hexdigest()


def write_data_file(path: Path, data: torch.Tensor, size: int, policy: DirectIOPolicy) -> str:
    """Write the first ``size`` bytes of ``data``, fsync, and return their xxh3_128 digest.

    ``data`` is a page-aligned uint8 CPU tensor with room for ``size`` rounded up to a page.
    """
    view = data.numpy().data
    if policy.wanted:
        try:
            return _write(path, view, size, direct=True)
        except OSError as exc:
            if not policy.refused(exc):
                raise
    return _write(path, view, size, direct=False)
