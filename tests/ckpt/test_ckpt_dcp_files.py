"""DCP's files through goodput: hashed as written, O_DIRECT through one buffer, exact sizes."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import xxhash

from goodput.checkpoint.engine import dcp_files
from goodput.checkpoint.engine.dcp_files import (
    DIGEST_SUFFIX,
    DirectHashingStream,
    HashingFileSystem,
)


def _pieces() -> list[bytes]:
    """Writes of odd sizes: some within the buffer, one across several buffers."""
    return [os.urandom(n) for n in (30, 16, 5000, 3 * 8192 + 7, 1, 8192, 100)]


@pytest.fixture(autouse=True)
def _small_buffer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dcp_files, "STREAM_BUFFER_BYTES", 8192)


def test_a_stream_writes_hashes_and_tells_every_byte(tmp_path: Path) -> None:
    path = tmp_path / "data.distcp"
    stream = DirectHashingStream(path)
    expected = b""
    for piece in _pieces():
        assert stream.tell() == len(expected)
        assert stream.write(memoryview(piece)) == len(piece)
        expected += piece
    stream.close()
    stream.close()  # DCP closes it, and so does the file system's context
    assert path.read_bytes() == expected
    assert stream.hasher.hexdigest() == xxhash.xxh3_128_hexdigest(expected)


def test_the_file_system_leaves_the_digest_beside_the_file(tmp_path: Path) -> None:
    path = tmp_path / "__0_0.distcp"
    with HashingFileSystem().create_stream(path, "wb") as stream:
        for piece in _pieces():
            stream.write(piece)
    digest = (tmp_path / f"__0_0.distcp{DIGEST_SUFFIX}").read_text()
    assert digest == xxhash.xxh3_128_hexdigest(path.read_bytes())
    with HashingFileSystem().create_stream(path, "rb") as stream:
        assert stream.read(30) == path.read_bytes()[:30]


def test_a_failed_write_leaves_no_digest(tmp_path: Path) -> None:
    path = tmp_path / "__0_1.distcp"
    with pytest.raises(RuntimeError), HashingFileSystem().create_stream(path, "wb") as stream:
        stream.write(b"x" * 10)
        raise RuntimeError("the writer failed")
    assert not (tmp_path / f"__0_1.distcp{DIGEST_SUFFIX}").exists()


def test_a_filesystem_refusing_o_direct_gets_buffered_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fake open answers EINVAL to O_DIRECT, as tmpfs did before Linux 6.6."""
    real_open = dcp_files.open_for_write

    def refusing_open(path: Path, direct: bool) -> int:
        if direct:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, direct)

    monkeypatch.setattr(dcp_files, "open_for_write", refusing_open)
    path = tmp_path / "data.distcp"
    stream = DirectHashingStream(path)
    expected = b"".join(_pieces())
    stream.write(expected)
    stream.close()
    assert path.read_bytes() == expected
