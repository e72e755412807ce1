"""One TCP connection of the peer data plane.

Control messages go through asyncio's socket primitives. Headers are read exactly (never
past their end), so the raw file bytes that follow can be moved by a worker thread on the
socket switched to blocking mode: ``sendfile`` straight from the page cache on the sending
side; on the receiving side ``recv_into`` with ``MSG_WAITALL`` into a few large, reused,
page-aligned buffers, handed through a bounded queue to a writer thread that hashes and
writes them while the next ones arrive: with O_DIRECT where the filesystem allows it (a
replica, not read soon), or through the page cache with write-back started as they land (a
restore, read by the ranks right after). The event loop stays free for other connections,
and a per-syscall timeout turns a stalled peer into an error instead of a stuck thread.
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import mmap
import os
import queue
import socket
import struct
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import msgspec

from goodput.checkpoint.format import Xxh3, open_regular
from goodput.checkpoint.tiers.peer.protocol import HEADER_LENGTH, MAX_HEADER_BYTES, frame
from goodput.checkpoint.tiers.writeback import start_writeback

BUFFER_BYTES = 8 << 20
BUFFER_COUNT = 4  # at most, per receiving connection: one being received, the rest written
DIRECT_ALIGN = 4096  # O_DIRECT offsets, lengths and buffer addresses are multiples of this
SENDFILE_SLICE_BYTES = 8 << 20
STALL_TIMEOUT_S = 60.0
_O_DIRECT = getattr(os, "O_DIRECT", 0)

Progress = Callable[[int], None]

# Bulk transfers get a pool of their own, so that they cannot starve asyncio's default
# executor (nor it them).
_TRANSFERS = ThreadPoolExecutor(max_workers=16, thread_name_prefix="goodput-peer-transfer")


class ProtocolError(ConnectionError):
    """The other side sent something that does not follow the protocol, or hung up."""


class StreamWriteError(OSError):
    """Received bytes could not be written (e.g. disk full); the stream was drained."""


class FileSink:
    """Appends to ``fd`` from its current position, with O_DIRECT where it can, or (``cached``)
    through the page cache with each range's write-back started as it is written.

    A replica's bytes go straight to the disk instead of through the page cache: on a VM,
    filling fresh page-cache pages and writing them back at fsync costs more than the
    network copy (measured in docs/BENCHMARKS.md), and nobody reads them soon. O_DIRECT needs
    block-aligned file offsets, lengths and buffer addresses, so an unaligned tail (or a
    resumed, unaligned start) is written through the page cache; the caller's fsync covers
    both. Where the filesystem refuses O_DIRECT (tmpfs), every write is buffered.

    A restore's bytes are read by the ranks right after it: written ``cached``, that read
    finds them in memory instead of reading the disk again (docs/BENCHMARKS.md, *Sharded
    across nodes*), and the early write-back leaves the caller's fsync little to wait for.
    """

    def __init__(self, fd: int, *, cached: bool = False) -> None:
        self.fd = fd
        self.position = os.lseek(fd, 0, os.SEEK_CUR)
        self._flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        self._cached = cached
        self._writeback = cached  # until the filesystem refuses it
        self._direct_ok = _O_DIRECT != 0 and not cached

    def write(self, view: memoryview) -> None:
        """Write all of ``view`` (which starts page-aligned in memory when it can go direct)."""
        if self._cached:
            start = self.position
            self._write_all(view)
            if self._writeback:
                self._writeback = start_writeback(self.fd, start, self.position - start)
            return
        if self._direct_ok and self.position % DIRECT_ALIGN == 0:
            aligned = len(view) - len(view) % DIRECT_ALIGN
            if aligned and self._set_direct(True):
                start = self.position
                try:
                    self._write_all(view[:aligned])
                except OSError as exc:  # refused after all: the rest goes buffered
                    if exc.errno != errno.EINVAL:
                        raise
                    self._direct_ok = False
                view = view[self.position - start :]
        if view:
            self._set_direct(False)
            self._write_all(view)

    def _write_all(self, view: memoryview) -> None:
        while view:
            written = os.write(self.fd, view)
            self.position += written
            view = view[written:]

    def _set_direct(self, on: bool) -> bool:
        wanted = (self._flags | _O_DIRECT) if on else (self._flags & ~_O_DIRECT)
        if wanted != self._flags:
            try:
                fcntl.fcntl(self.fd, fcntl.F_SETFL, wanted)
            except OSError:
                self._direct_ok = False
                return False
            self._flags = wanted
        return on == bool(self._flags & _O_DIRECT)


def _set_stall_timeout(sock: socket.socket, seconds: float) -> None:
    timeval = struct.pack("ll", int(seconds), int((seconds % 1) * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)


class Channel:
    def __init__(self, sock: socket.socket) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        _set_stall_timeout(sock, STALL_TIMEOUT_S)
        sock.setblocking(False)
        self.sock = sock
        self.loop = asyncio.get_running_loop()
        self._receive_buffers: list[mmap.mmap] = []

    async def send(self, message: msgspec.Struct) -> None:
        await self.loop.sock_sendall(self.sock, frame(message))

    async def read_exact(self, count: int) -> bytes:
        buffer = bytearray(count)
        view = memoryview(buffer)
        filled = 0
        while filled < count:
            n = await self.loop.sock_recv_into(self.sock, view[filled:])
            if n == 0:
                raise ProtocolError("connection closed by peer")
            filled += n
        return bytes(buffer)

    async def receive(self, decoder: msgspec.msgpack.Decoder):
        (length,) = HEADER_LENGTH.unpack(await self.read_exact(HEADER_LENGTH.size))
        if length > MAX_HEADER_BYTES:
            raise ProtocolError(f"header of {length} bytes exceeds {MAX_HEADER_BYTES}")
        try:
            return decoder.decode(await self.read_exact(length))
        except msgspec.DecodeError as exc:
            raise ProtocolError(f"undecodable message: {exc}") from exc

    async def _bulk(self, work: Callable[[Progress], None], progress: Progress | None) -> None:
        """Run ``work`` in a worker thread with the socket in blocking mode; its progress
        reports are delivered on the event loop."""

        def report(n: int) -> None:
            if progress is not None:
                self.loop.call_soon_threadsafe(progress, n)

        self.sock.setblocking(True)
        try:
            await asyncio.shield(self.loop.run_in_executor(_TRANSFERS, work, report))
        finally:
            if self.sock.fileno() != -1:
                self.sock.setblocking(False)

    async def send_file(
        self, path: Path, offset: int, count: int, progress: Progress | None = None
    ) -> None:
        with os.fdopen(open_regular(path), "rb") as f:
            await self._bulk(lambda report: self._sendfile(f, offset, count, report), progress)

    def _sendfile(self, f, offset: int, count: int, report: Progress) -> None:
        end = offset + count
        # A checkpoint the engine wrote with O_DIRECT is not in the page cache: a larger
        # readahead window keeps the disk ahead of the socket (measured: +15-40 % cold).
        os.posix_fadvise(f.fileno(), offset, count, os.POSIX_FADV_SEQUENTIAL)
        while offset < end:
            try:
                sent = os.sendfile(
                    self.sock.fileno(), f.fileno(), offset, min(SENDFILE_SLICE_BYTES, end - offset)
                )
            except BlockingIOError as exc:
                raise ProtocolError(f"peer stalled for {STALL_TIMEOUT_S:.0f} s") from exc
            if sent == 0:
                raise ProtocolError("file shrank while being sent")
            offset += sent
            report(sent)

    async def receive_to_file(
        self,
        fd: int,
        count: int,
        hasher: Xxh3,
        progress: Progress | None = None,
        *,
        cached: bool = False,
    ) -> None:
        """Append exactly ``count`` bytes from the socket to ``fd``, hashing them.

        A writer thread hashes and writes each buffer while the next one is received (see
        :class:`FileSink` for O_DIRECT, and ``cached`` for bytes that are read right after).
        If the connection drops, every byte received so far is still written before the
        error propagates, so the partial file reflects the true resume offset. If writing fails (disk full), the rest of the stream is read and
        discarded so the connection stays in step, then :class:`StreamWriteError` is raised.
        """
        await self._bulk(
            lambda report: self._receive(FileSink(fd, cached=cached), count, hasher, report),
            progress,
        )

    def _free_buffer(self, free: queue.SimpleQueue[mmap.mmap]) -> mmap.mmap:
        """A buffer the writer is done with, or a new one while the connection has fewer than
        BUFFER_COUNT: page-aligned (O_DIRECT can write from them) and kept for the next file,
        since touching fresh pages costs more on a VM than the copy into them. Made only when
        the writer lags, so a writer that keeps up faults in two, not BUFFER_COUNT."""
        try:
            return free.get_nowait()
        except queue.Empty:
            if len(self._receive_buffers) < BUFFER_COUNT:
                self._receive_buffers.append(mmap.mmap(-1, BUFFER_BYTES))
                return self._receive_buffers[-1]
            return free.get()

    def _receive(self, sink: FileSink, count: int, hasher: Xxh3, report: Progress) -> None:
        free: queue.SimpleQueue[mmap.mmap] = queue.SimpleQueue()
        for buffer in self._receive_buffers:
            free.put(buffer)
        filled_queue: queue.SimpleQueue[tuple[mmap.mmap, int] | None] = queue.SimpleQueue()
        write_error: list[BaseException] = []

        def write_loop() -> None:
            # After a failure, keep taking buffers (and giving them back) without writing,
            # so the receiving side drains the stream instead of waiting for a free buffer.
            while (item := filled_queue.get()) is not None:
                buffer, length = item
                if not write_error:
                    view = memoryview(buffer)[:length]
                    try:
                        hasher.update(view)
                        sink.write(view)
                    except BaseException as exc:
                        write_error.append(exc)
                    finally:
                        view.release()
                free.put(buffer)

        # A thread per file, not a pool: a writer lives as long as its file, and a pool of
        # them could leave a receiver waiting for a free writer while its peer times out.
        writer = threading.Thread(target=write_loop, name="goodput-peer-write", daemon=True)
        writer.start()
        received = 0
        # A resumed file may start mid-block: the first buffer ends on a block boundary so
        # that every later one can be written with O_DIRECT.
        first = BUFFER_BYTES - sink.position % DIRECT_ALIGN
        try:
            while received < count:
                buffer = self._free_buffer(free)
                want = min(first if received == 0 else BUFFER_BYTES, count - received)
                try:
                    filled = self._recv_fill(memoryview(buffer)[:want])
                except BaseException:
                    free.put(buffer)
                    raise
                filled_queue.put((buffer, filled))
                received += filled
                report(filled)
                if filled < want:
                    raise ProtocolError(f"connection closed after {received} of {count} bytes")
        finally:
            filled_queue.put(None)
            writer.join()
        if write_error:
            error = write_error[0]
            if not isinstance(error, OSError):
                raise error
            raise StreamWriteError(f"{error.strerror or error}") from error

    def _recv_fill(self, view: memoryview) -> int:
        """Fill ``view``; fewer bytes only if the peer closed the connection."""
        filled = 0
        while filled < len(view):
            try:
                n = self.sock.recv_into(view[filled:], len(view) - filled, socket.MSG_WAITALL)
            except BlockingIOError as exc:
                if filled:
                    return filled  # keep what arrived; the next call reports the stall
                raise ProtocolError(f"peer stalled for {STALL_TIMEOUT_S:.0f} s") from exc
            except ConnectionError:
                if filled:
                    return filled
                raise
            if n == 0:
                break
            filled += n
        return filled

    def close(self) -> None:
        self.sock.close()
        self._receive_buffers = []


async def open_channel(host: str, port: int, timeout_s: float = 10.0) -> Channel:
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    family, type_, proto, _, address = infos[0]
    sock = socket.socket(family, type_, proto)
    sock.setblocking(False)
    try:
        await asyncio.wait_for(loop.sock_connect(sock, address), timeout_s)
    except BaseException:
        sock.close()
        raise
    return Channel(sock)
