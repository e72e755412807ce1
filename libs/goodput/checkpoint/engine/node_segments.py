"""The node's host-memory tier: each rank's snapshot buffer as a named segment in /dev/shm.

The ranks of a node share its volume and save one slice each (DDP replicas) or their own
shards (FSDP2). After an in-process restart a rank needs the others' bytes too; they are in
its node-mates' host buffers, so the engine allocates those buffers as files in ``/dev/shm``
(the snapshot's own memory, no extra copy) under names every rank of the node derives from
the checkpoint root they share. A restoring rank reads the segments of the agreed step with
``pread`` (a mapping a peer could truncate would fault; a read just comes back short) and
checks every byte against the committed manifest's digests before using it: a segment is an
untrusted tier, and a missing, stale or corrupt one only means reading the volume instead.

A segment is ``HEADER_BYTES`` of header (a versioned msgspec record: which step and which
bytes of whose stream it holds; ``step`` -1 while being filled) and then the buffer,
page-aligned for O_DIRECT writes.

Cleanup: a segment's owner holds a shared ``flock`` on it for its life, which the kernel
drops when the process dies, SIGKILL included. The owner unlinks its segments when it frees
its buffers (``close``, or a buffer replaced by a larger one); segments whose owner died
(``sweep``: the lock is free) are unlinked by the engines of the same root at each save and
at close, so a dead rank's bytes stay readable to the restore that follows its death and go
at the survivors' next save. Segments of a job whose every rank was killed go with the next
run on that volume (its first save), and on Kubernetes with the pod's memory volume.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import logging
import mmap
import os
import stat
import struct
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import msgspec
import torch

from goodput.checkpoint.engine.buffers import pin_host
from goodput.checkpoint.engine.plan import IO_ALIGN, align_up
from goodput.checkpoint.format.shm_segments import (
    OPEN_UNTRUSTED,
    SEGMENT_DIR,
    segment_names,
    segment_prefix,
    sweep_dead,
)

log = logging.getLogger(__name__)

SEGMENT_FORMAT = "goodput-segment/1"
#: the header's page: the buffer after it stays page-aligned
HEADER_BYTES = IO_ALIGN
_LENGTH = struct.Struct("<I")
_counter = itertools.count()


class SegmentHeader(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """What a segment holds: bytes ``[slice_start, slice_start + nbytes)`` of rank
    ``dp_rank``'s stream of ``step`` (a sharded save's stream is the rank's own shards)."""

    format: str = SEGMENT_FORMAT
    step: int = -1
    dp_rank: int = 0
    dp_world: int = 1
    sharded: bool = False
    slice_start: int = 0
    nbytes: int = 0


_EMPTY = SegmentHeader()


class SharedBuffer:
    """A host buffer living in a ``/dev/shm`` segment (same interface as ``HostBuffer``).

    Raises OSError where the segment cannot be made (no ``/dev/shm``, or it is too small:
    the space is reserved up front, so a full tmpfs fails here rather than with SIGBUS)."""

    def __init__(self, directory: Path, prefix: str, nbytes: int, *, pin_memory: bool) -> None:
        self.capacity = align_up(max(nbytes, IO_ALIGN), IO_ALIGN)
        size = HEADER_BYTES + self.capacity
        name = f"{prefix}{os.getpid()}-{next(_counter)}"
        hidden = directory / f".{name}"  # not a segment name until locked: sweeps skip it
        fd = os.open(hidden, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            os.posix_fallocate(fd, 0, size)
            self._map = mmap.mmap(fd, size)
            os.rename(hidden, directory / name)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(hidden)
            raise
        self.path = directory / name
        # unlinked at release, or when the buffer is collected or the interpreter exits
        self._remove = weakref.finalize(self, _remove, self.path, fd)
        # the tensor keeps the mapping alive: it is unmapped only once no view of it is left
        self.data = torch.frombuffer(self._map, dtype=torch.uint8, offset=HEADER_BYTES)
        self.pin_requested = pin_memory
        self.pinned = pin_host(self.data, pin_memory)
        self.describe(_EMPTY)

    def describe(self, header: SegmentHeader) -> None:
        """Say what the buffer now holds (``step`` -1 before it is overwritten)."""
        body = msgspec.json.encode(header)
        self._map[: _LENGTH.size + len(body)] = _LENGTH.pack(len(body)) + body

    def release(self) -> None:
        """Unlink the segment and drop the lock; the memory goes with the last view of it."""
        if self.pinned:
            torch.cuda.cudart().cudaHostUnregister(self.data.data_ptr())
            self.pinned = False
        self.data = torch.empty(0, dtype=torch.uint8)
        self._remove()


def _remove(path: Path, fd: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    os.close(fd)  # drops the lock


@dataclass
class PeerSegment:
    """A segment of the node read by a restoring rank: its claimed header and an open file
    (the bytes are read with ``read`` and must still be checked against the manifest)."""

    name: str
    header: SegmentHeader
    fd: int

    def covers(self, start: int, end: int) -> bool:
        first = self.header.slice_start
        return first <= start <= end <= first + self.header.nbytes

    def read(self, start: int, out: memoryview) -> bool:
        """Stream bytes from ``start`` into ``out``; False if the segment comes back short."""
        position = HEADER_BYTES + start - self.header.slice_start
        got = 0
        while got < len(out):
            try:
                count = os.preadv(self.fd, [out[got:]], position + got)
            except OSError:
                return False
            if count == 0:
                return False
            got += count
        return True


def _read_header(fd: int) -> SegmentHeader | None:
    head = os.pread(fd, HEADER_BYTES, 0)
    if len(head) < _LENGTH.size:
        return None
    (length,) = _LENGTH.unpack_from(head)
    if length > HEADER_BYTES - _LENGTH.size:
        return None
    try:
        header = msgspec.json.decode(head[_LENGTH.size : _LENGTH.size + length], type=SegmentHeader)
    except msgspec.DecodeError:  # ValidationError included
        return None
    return header if header.format == SEGMENT_FORMAT else None


class NodeSegments:
    """The segments of one checkpoint root on this host: making, finding and sweeping them."""

    def __init__(self, root: Path, directory: Path = SEGMENT_DIR) -> None:
        self.root = root
        self.directory = directory
        self.prefix = segment_prefix(root)

    def allocate(self, nbytes: int, *, pin_memory: bool) -> SharedBuffer:
        return SharedBuffer(self.directory, self.prefix, nbytes, pin_memory=pin_memory)

    def _names(self) -> list[str]:
        return segment_names(self.directory, self.prefix)

    @contextlib.contextmanager
    def peers(
        self, step: int, *, sharded: bool, exclude: frozenset[str] | set[str] = frozenset()
    ) -> Iterator[list[PeerSegment]]:
        """The node's segments that claim to hold part of ``step`` (opened read-only, closed
        on exit), except ``exclude`` (this rank's own); claims are not yet checked."""
        found: list[PeerSegment] = []
        try:
            for name in self._names():
                if name in exclude:
                    continue
                try:
                    fd = os.open(self.directory / name, OPEN_UNTRUSTED)
                except OSError:
                    continue  # swept meanwhile
                header = None
                with contextlib.suppress(OSError):
                    if stat.S_ISREG(os.fstat(fd).st_mode):
                        header = _read_header(fd)
                if header is None or header.step != step or header.sharded != sharded:
                    os.close(fd)
                    continue
                found.append(PeerSegment(name, header, fd))
            yield found
        finally:
            for peer in found:
                os.close(peer.fd)

    def sweep(self) -> list[str]:
        """Unlink the segments whose owner is gone (nobody holds their lock); returns them."""
        return sweep_dead(self.root, self.directory)


class StreamSource(Protocol):
    """Bytes of one rank's stream held in host memory (claimed: the reader verifies them)."""

    def covers(self, start: int, end: int) -> bool: ...

    def read(self, start: int, out: memoryview) -> bool: ...


@dataclass
class BufferSource:
    """This rank's own host buffer: stream bytes from ``slice_start`` on."""

    data: torch.Tensor
    slice_start: int
    nbytes: int

    def covers(self, start: int, end: int) -> bool:
        return self.slice_start <= start <= end <= self.slice_start + self.nbytes

    def read(self, start: int, out: memoryview) -> bool:
        first = start - self.slice_start
        destination = torch.frombuffer(out, dtype=torch.uint8) if len(out) else None
        if destination is not None:
            destination.copy_(self.data[first : first + len(out)])
        return True
