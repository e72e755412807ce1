"""One TCP connection of the peer data plane.

Control messages go through asyncio's socket primitives. Headers are read exactly (never
past their end), so the raw file bytes that follow can be moved by a worker thread on the
socket switched to blocking mode: ``sendfile`` straight from the page cache on the sending
side, ``recv_into`` with ``MSG_WAITALL`` into large reusable buffers on the receiving side,
with hashing and writing of one buffer overlapping the receipt of the next. The event loop
stays free for other connections, and a per-syscall timeout turns a stalled peer into an
error instead of a stuck thread.
"""

from __future__ import annotations

import asyncio
import os
import socket
import struct
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import msgspec
import xxhash

from goodput.tiers.checksum import write_all
from goodput.tiers.peer.protocol import HEADER_LENGTH, MAX_HEADER_BYTES, frame

BUFFER_BYTES = 8 << 20
SENDFILE_SLICE_BYTES = 8 << 20
STALL_TIMEOUT_S = 60.0

Progress = Callable[[int], None]

# Bulk transfers and the disk writes they feed get pools of their own, so that neither
# can starve the other nor asyncio's default executor.
_TRANSFERS = ThreadPoolExecutor(max_workers=16, thread_name_prefix="goodput-peer-transfer")
_WRITERS = ThreadPoolExecutor(max_workers=16, thread_name_prefix="goodput-peer-write")


class ProtocolError(ConnectionError):
    """The other side sent something that does not follow the protocol, or hung up."""


class StreamWriteError(OSError):
    """Received bytes could not be written (e.g. disk full); the stream was drained."""


def _hash_and_write(fd: int, hasher: xxhash.xxh3_128, view: memoryview) -> None:
    hasher.update(view)
    write_all(fd, view)


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
        with open(path, "rb") as f:
            await self._bulk(lambda report: self._sendfile(f, offset, count, report), progress)

    def _sendfile(self, f, offset: int, count: int, report: Progress) -> None:
        end = offset + count
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
        self, fd: int, count: int, hasher: xxhash.xxh3_128, progress: Progress | None = None
    ) -> None:
        """Append exactly ``count`` bytes from the socket to ``fd``, hashing them.

        If the connection drops, every byte received so far is still written before the
        error propagates, so the partial file reflects the true resume offset. If writing
        fails (disk full), the rest of the stream is read and discarded so the connection
        stays in step, then :class:`StreamWriteError` is raised.
        """
        await self._bulk(lambda report: self._receive(fd, count, hasher, report), progress)

    def _receive(self, fd: int, count: int, hasher: xxhash.xxh3_128, report: Progress) -> None:
        buffers = [bytearray(min(BUFFER_BYTES, count)) for _ in range(2)]
        pending: Future[None] | None = None
        write_error: OSError | None = None

        def settle() -> None:
            nonlocal pending, write_error
            if pending is not None:
                try:
                    pending.result()
                except OSError as exc:
                    write_error = write_error or exc
                pending = None

        received = 0
        index = 0
        try:
            while received < count:
                view = memoryview(buffers[index % 2])[: min(BUFFER_BYTES, count - received)]
                filled = self._recv_fill(view)
                settle()
                if write_error is None and filled:
                    pending = _WRITERS.submit(_hash_and_write, fd, hasher, view[:filled])
                received += filled
                index += 1
                report(filled)
                if filled < len(view):
                    raise ProtocolError(f"connection closed after {received} of {count} bytes")
        finally:
            settle()
        if write_error is not None:
            raise StreamWriteError(f"{write_error.strerror or write_error}") from write_error

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
