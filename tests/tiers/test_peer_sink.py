"""FileSink: how the peer data plane's receiver writes (O_DIRECT where it can, buffered for
unaligned heads and tails, buffered everywhere where O_DIRECT is refused; a restore's bytes
through the page cache, their write-back started as they land)."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import fcntl
import mmap
import os
import socket
import threading
import time
from pathlib import Path

import pytest
import xxhash

from goodput.checkpoint.tiers import writeback
from goodput.checkpoint.tiers.peer import channel
from goodput.checkpoint.tiers.peer.channel import DIRECT_ALIGN, FileSink


def aligned_buffer(data: bytes) -> memoryview:
    buffer = mmap.mmap(-1, max(len(data), 1))
    buffer[: len(data)] = data
    return memoryview(buffer)[: len(data)]


def write_chunks(
    path: Path, start: bytes, chunks: list[bytes], *, cached: bool = False
) -> FileSink:
    path.write_bytes(start)
    fd = os.open(path, os.O_WRONLY)
    try:
        os.lseek(fd, len(start), os.SEEK_SET)
        sink = FileSink(fd, cached=cached)
        for chunk in chunks:
            sink.write(aligned_buffer(chunk))
        os.fsync(fd)
    finally:
        os.close(fd)
    return sink


@pytest.mark.parametrize(
    "start, sizes",
    [
        (0, [8 * DIRECT_ALIGN, 8 * DIRECT_ALIGN]),  # all aligned
        (0, [8 * DIRECT_ALIGN, 3 * DIRECT_ALIGN + 17]),  # unaligned tail
        (1234, [8 * DIRECT_ALIGN - 1234, 8 * DIRECT_ALIGN]),  # resumed mid-block
        (0, [100]),  # smaller than a block
        (0, [5 * DIRECT_ALIGN + 1, 3 * DIRECT_ALIGN]),  # misaligned after the first chunk
    ],
)
@pytest.mark.parametrize("cached", [False, True])
def test_sink_writes_exactly_the_bytes_in_order(
    tmp_path: Path, start: int, sizes: list[int], cached: bool
):
    head = os.urandom(start)
    chunks = [os.urandom(n) for n in sizes]
    sink = write_chunks(tmp_path / "f", head, chunks, cached=cached)
    assert (tmp_path / "f").read_bytes() == head + b"".join(chunks)
    assert sink.position == start + sum(sizes)


def test_sink_falls_back_to_buffered_writes_where_o_direct_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write = os.write
    refused = []

    def write(fd: int, data) -> int:
        if fcntl.fcntl(fd, fcntl.F_GETFL) & channel._O_DIRECT:
            refused.append(len(data))
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_write(fd, data)

    monkeypatch.setattr(channel.os, "write", write)
    chunks = [os.urandom(4 * DIRECT_ALIGN), os.urandom(4 * DIRECT_ALIGN + 5)]
    write_chunks(tmp_path / "f", b"", chunks)
    assert (tmp_path / "f").read_bytes() == b"".join(chunks)
    assert len(refused) == 1  # learned once, then buffered


def test_sink_reports_a_full_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def write(fd: int, data) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(channel.os, "write", write)
    with pytest.raises(OSError, match="No space left"):
        write_chunks(tmp_path / "f", b"", [os.urandom(DIRECT_ALIGN)])


def test_aligned_chunks_skip_the_page_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    real_write = os.write
    direct = []

    def write(fd: int, data) -> int:
        direct.append(bool(fcntl.fcntl(fd, fcntl.F_GETFL) & channel._O_DIRECT))
        return real_write(fd, data)

    monkeypatch.setattr(channel.os, "write", write)
    write_chunks(tmp_path / "f", b"", [os.urandom(2 * DIRECT_ALIGN), os.urandom(DIRECT_ALIGN + 9)])
    assert direct == [True, True, False]  # two aligned writes, then the 9-byte tail buffered


def test_a_cached_sink_writes_through_the_page_cache_and_starts_each_writeback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    real_write = os.write
    direct = []
    written_back: list[tuple[int, int]] = []

    def write(fd: int, data) -> int:
        direct.append(bool(fcntl.fcntl(fd, fcntl.F_GETFL) & channel._O_DIRECT))
        return real_write(fd, data)

    def start_writeback(fd: int, offset: int, count: int) -> bool:
        written_back.append((offset, count))
        return writeback.start_writeback(fd, offset, count)  # the real call: must take these

    monkeypatch.setattr(channel.os, "write", write)
    monkeypatch.setattr(channel, "start_writeback", start_writeback)
    chunks = [os.urandom(2 * DIRECT_ALIGN), os.urandom(DIRECT_ALIGN + 9)]
    write_chunks(tmp_path / "f", b"head", chunks, cached=True)
    assert (tmp_path / "f").read_bytes() == b"head" + b"".join(chunks)
    assert direct == [False, False]
    assert written_back == [(4, 2 * DIRECT_ALIGN), (4 + 2 * DIRECT_ALIGN, DIRECT_ALIGN + 9)]


def test_a_cached_sink_stops_asking_where_writeback_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    asked = []

    def refused(fd: int, offset: int, count: int) -> bool:
        asked.append(offset)
        return False  # e.g. ENOSYS in a sandbox: the fsync does the writing

    monkeypatch.setattr(channel, "start_writeback", refused)
    chunks = [os.urandom(DIRECT_ALIGN), os.urandom(DIRECT_ALIGN), os.urandom(7)]
    write_chunks(tmp_path / "f", b"", chunks, cached=True)
    assert (tmp_path / "f").read_bytes() == b"".join(chunks)
    assert asked == [0]


def test_starting_writeback_reports_an_unusable_descriptor(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "f", os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"x" * DIRECT_ALIGN)
    started = writeback.start_writeback(fd, 0, DIRECT_ALIGN)
    os.close(fd)
    if not started:
        pytest.skip("no sync_file_range here: write-back is left to the fsync")
    with pytest.raises(OSError) as error:
        writeback.start_writeback(fd, 0, DIRECT_ALIGN)
    assert error.value.errno == errno.EBADF


def test_starting_writeback_is_skipped_where_it_is_unsupported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unsupported(fd: int, offset: int, count: int, flags: int) -> int:
        ctypes.set_errno(errno.ENOSYS)
        return -1

    monkeypatch.setattr(writeback, "_sync_file_range", unsupported)
    with open(tmp_path / "f", "wb") as f:
        assert writeback.start_writeback(f.fileno(), 0, DIRECT_ALIGN) is False


# ---- the receive pipeline (socket -> buffers -> writer thread), over a socketpair -------


@contextlib.asynccontextmanager
async def stream(payload: bytes, hang_up: bool = False):
    """A Channel over loopback TCP whose other end sends ``payload`` from a thread (then
    hangs up, if asked)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        theirs = socket.create_connection(listener.getsockname())
        ours, _ = listener.accept()

    def send() -> None:
        with contextlib.suppress(OSError):  # the receiver may close first, on failure
            theirs.sendall(payload)
            if hang_up:
                theirs.shutdown(socket.SHUT_WR)

    sender = threading.Thread(target=send)
    sender.start()
    try:
        chan = channel.Channel(ours)
        yield chan
    finally:
        ours.close()
        await asyncio.to_thread(sender.join)
        theirs.close()


async def receive_into(
    chan: channel.Channel, path: Path, count: int, cached: bool = False
) -> xxhash.xxh3_128:
    hasher = xxhash.xxh3_128()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        await chan.receive_to_file(fd, count, hasher, cached=cached)
    finally:
        os.close(fd)
    return hasher


@pytest.fixture
def small_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(channel, "BUFFER_BYTES", 16 * DIRECT_ALIGN)


@pytest.mark.parametrize("cached", [False, True])
async def test_receive_pipeline_writes_and_hashes_every_byte(
    tmp_path: Path, small_buffers, cached: bool
):
    data = os.urandom(40 * 16 * DIRECT_ALIGN + 123)  # many buffers, unaligned tail
    async with stream(data) as chan:
        hasher = await receive_into(chan, tmp_path / "f", len(data), cached)
    assert (tmp_path / "f").read_bytes() == data
    assert hasher.hexdigest() == xxhash.xxh3_128_hexdigest(data)


async def test_a_connection_makes_at_most_its_buffers_and_keeps_them_for_the_next_file(
    tmp_path: Path, small_buffers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer that lags makes the receiver take a new buffer, up to BUFFER_COUNT; the next
    file on the connection reuses those, with no new ones."""
    real_write = FileSink.write

    def slow_write(self: FileSink, view: memoryview) -> None:
        time.sleep(0.002)
        real_write(self, view)

    monkeypatch.setattr(FileSink, "write", slow_write)
    first, second = os.urandom(30 * 16 * DIRECT_ALIGN), os.urandom(20 * 16 * DIRECT_ALIGN + 7)
    async with stream(first + second) as chan:
        await receive_into(chan, tmp_path / "first", len(first))
        buffers = list(chan._receive_buffers)
        await receive_into(chan, tmp_path / "second", len(second))
        assert chan._receive_buffers == buffers
    assert 2 <= len(buffers) <= channel.BUFFER_COUNT
    assert (tmp_path / "first").read_bytes() == first
    assert (tmp_path / "second").read_bytes() == second


async def test_a_write_failure_drains_the_stream_and_keeps_the_connection_in_step(
    tmp_path: Path, small_buffers, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_write = FileSink.write
    writes = 0

    def failing_write(self: FileSink, view: memoryview) -> None:
        nonlocal writes
        writes += 1
        if writes == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(self, view)

    monkeypatch.setattr(FileSink, "write", failing_write)
    data = os.urandom(20 * 16 * DIRECT_ALIGN)
    async with stream(data + b"NEXT") as chan:
        with pytest.raises(channel.StreamWriteError, match="No space left"):
            await receive_into(chan, tmp_path / "f", len(data))
        assert await chan.read_exact(4) == b"NEXT"  # exactly the file's bytes were consumed


async def test_an_unexpected_writer_error_does_not_hang_the_receiver(
    tmp_path: Path, small_buffers, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken_write(self: FileSink, view: memoryview) -> None:
        raise RuntimeError("bug in the writer")

    monkeypatch.setattr(FileSink, "write", broken_write)
    data = os.urandom(20 * 16 * DIRECT_ALIGN)
    async with stream(data) as chan:
        with pytest.raises(RuntimeError, match="bug in the writer"):
            await asyncio.wait_for(receive_into(chan, tmp_path / "f", len(data)), 30)


async def test_a_dropped_connection_still_writes_what_arrived(tmp_path: Path, small_buffers):
    data = os.urandom(10 * 16 * DIRECT_ALIGN)
    arrived = 3 * 16 * DIRECT_ALIGN + 5000
    async with stream(data[:arrived], hang_up=True) as chan:
        with pytest.raises(channel.ProtocolError, match="connection closed"):
            await receive_into(chan, tmp_path / "f", len(data))
    assert (tmp_path / "f").read_bytes() == data[:arrived]
