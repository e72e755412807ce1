"""FileSink: how the peer data plane's receiver writes (O_DIRECT where it can, buffered for
unaligned heads and tails, buffered everywhere where O_DIRECT is refused)."""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
from pathlib import Path

import pytest

from goodput.tiers.peer import channel
from goodput.tiers.peer.channel import DIRECT_ALIGN, FileSink


def aligned_buffer(data: bytes) -> memoryview:
    buffer = mmap.mmap(-1, max(len(data), 1))
    buffer[: len(data)] = data
    return memoryview(buffer)[: len(data)]


def write_chunks(path: Path, start: bytes, chunks: list[bytes]) -> FileSink:
    path.write_bytes(start)
    fd = os.open(path, os.O_WRONLY)
    try:
        os.lseek(fd, len(start), os.SEEK_SET)
        sink = FileSink(fd)
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
def test_sink_writes_exactly_the_bytes_in_order(tmp_path: Path, start: int, sizes: list[int]):
    head = os.urandom(start)
    chunks = [os.urandom(n) for n in sizes]
    sink = write_chunks(tmp_path / "f", head, chunks)
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
