"""The files ``GoodputStorageWriter`` has DCP write: hashed as written, with O_DIRECT.

DCP writes each file front to back through a stream (``write`` and ``tell``; it never seeks).
``DirectHashingStream`` hashes every byte (xxh3_128) on the way and writes through one reused
page-aligned buffer with O_DIRECT, like the engine (``goodput.checkpoint.engine.fileio``): no page cache to
fill and write back, and the training job's own pages stay cached. The last partial block is
written padded and the file truncated to its size, then fsynced. Where the filesystem refuses
O_DIRECT the same stream writes through the page cache. The digest is left beside the file
(``DIGEST_SUFFIX``) for the coordinator's manifest: for every other rank the coordinator is
another process.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import xxhash
from torch.distributed.checkpoint.filesystem import FileSystem

from goodput.checkpoint.engine.buffers import HostBuffer
from goodput.checkpoint.engine.fileio import hash_in_slices, open_for_write, pwrite_all
from goodput.checkpoint.engine.plan import IO_ALIGN, align_up

#: bytes gathered before each write (a multiple of IO_ALIGN); one buffer per open file
STREAM_BUFFER_BYTES = 16 << 20
#: a file's digest, left beside it by the process that wrote it, until the manifest takes it
DIGEST_SUFFIX = ".xxh3_128"


class DirectHashingStream:
    """A write-only file stream that hashes its bytes and writes them with O_DIRECT.

    Bytes reach the file each time the buffer fills and at ``close`` (which fsyncs); ``flush``
    does nothing, so an fsync before ``close`` (DCP's) covers only what was written so far.
    """

    def __init__(self, path: Path) -> None:
        self.hasher = xxhash.xxh3_128()
        try:
            self._fd, self._direct = open_for_write(path, direct=True), True
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
            self._fd, self._direct = open_for_write(path, direct=False), False
        self._buffer = HostBuffer(STREAM_BUFFER_BYTES)
        self._staging = self._buffer.data.numpy()
        self._written = 0
        self._filled = 0
        self._closed = False

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        hash_in_slices(self.hasher, view)
        source = np.frombuffer(view, dtype=np.uint8)
        capacity = len(self._staging)
        position = 0
        while position < len(source):
            count = min(len(source) - position, capacity - self._filled)
            # numpy copies large arrays without the GIL, so the other writers go on meanwhile
            self._staging[self._filled : self._filled + count] = source[position : position + count]
            self._filled += count
            position += count
            if self._filled == capacity:
                self._drain(capacity)
        return len(view)

    def _drain(self, length: int) -> None:
        pwrite_all(self._fd, self._staging.data[:length], self._written)
        self._written += self._filled
        self._filled = 0

    def tell(self) -> int:
        return self._written + self._filled

    def fileno(self) -> int:
        return self._fd

    def flush(self) -> None:
        """Nothing: an O_DIRECT write must be whole blocks (``close`` writes the tail)."""

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._filled:
                size = self._written + self._filled
                self._drain(align_up(self._filled, IO_ALIGN) if self._direct else self._filled)
                if self._direct:
                    os.ftruncate(self._fd, size)
            os.fsync(self._fd)
        finally:
            os.close(self._fd)
            self._buffer.release()


class HashingFileSystem(FileSystem):
    """DCP's FileSystem, writing through ``DirectHashingStream`` and leaving each file's digest
    beside it (no state: it pickles into ``async_save``'s checkpoint process)."""

    @contextmanager
    def create_stream(self, path: str | os.PathLike, mode: str) -> Iterator[Any]:
        if mode != "wb":
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        hashing = DirectHashingStream(Path(path))
        try:
            yield hashing
        finally:
            hashing.close()
        Path(f"{os.fspath(path)}{DIGEST_SUFFIX}").write_text(hashing.hasher.hexdigest())
