"""Reading, hashing and durably publishing checkpoint files.

Every open of a file a checkpoint names goes through :func:`open_regular`: a shard replaced
by a named pipe or a device would block a plain ``open`` (or a read) forever, so anything
but a regular file is refused at once as damage, and readers fall back.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat
import time
from pathlib import Path
from typing import Protocol, TypeVar

import msgspec

from goodput.checkpoint.format.hashing import Xxh3, add_read_cpu
from goodput.checkpoint.format.layout import trash_path

CHUNK_BYTES = 8 << 20


class ChecksumMismatch(ValueError):
    """Data does not hash to the checksum the manifest promises."""


class NotRegularFile(OSError):
    """A checkpoint file is a FIFO, device, socket or directory: damage, never data."""


def open_regular(path: str | os.PathLike, flags: int = os.O_RDONLY) -> int:
    """``os.open`` that never blocks on a FIFO and only returns descriptors of regular files.

    O_NONBLOCK makes opening a FIFO return at once; fstat then tells what was opened. The
    flag is cleared again so that reads of the regular file behave as usual.
    """
    fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFile(errno.EINVAL, "not a regular file", os.fspath(path))
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def unreadable_reason(exc: OSError) -> str:
    """Why a checkpoint file could not be opened or read, in the words every reader reports."""
    if isinstance(exc, FileNotFoundError):
        return "missing"
    if isinstance(exc, NotRegularFile):
        return "not a regular file"
    return f"unreadable ({exc.strerror or exc})"


def is_regular_file(path: Path) -> bool:
    """True for a regular file (following symlinks); never opens it."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def hash_file(
    path: str | os.PathLike, hasher: Xxh3 | None = None, limit: int | None = None
) -> Xxh3:
    """Feed the first ``limit`` bytes (all if None) of ``path`` into ``hasher``; return it."""
    hasher = hasher if hasher is not None else Xxh3()
    view = memoryview(bytearray(CHUNK_BYTES))
    remaining = limit
    fd = open_regular(path)
    try:
        while remaining is None or remaining > 0:
            want = CHUNK_BYTES if remaining is None else min(CHUNK_BYTES, remaining)
            started = time.thread_time()
            count = os.readv(fd, [view[:want]])
            add_read_cpu(time.thread_time() - started)
            if not count:
                break
            hasher.update(view[:count])
            if remaining is not None:
                remaining -= count
    finally:
        os.close(fd)
    return hasher


def file_xxh3_128(path: str | os.PathLike) -> str:
    """The manifest's checksum of a whole file."""
    return hash_file(path).hexdigest()


#: what identifies one version of a file without reading it: (inode, mtime ns, size)
Signature = tuple[int, int, int]


def file_signature(path: str | os.PathLike) -> Signature:
    """The file's :data:`Signature` (raises OSError when it cannot be stat'ed)."""
    info = os.stat(path)
    return (info.st_ino, info.st_mtime_ns, info.st_size)


def write_all(fd: int, view: memoryview) -> None:
    """os.write may write less than asked (e.g. near a full disk); loop until done."""
    while view:
        written = os.write(fd, view)
        view = view[written:]


def copy_and_hash(source: Path, dest: Path) -> str:
    """Copy in one pass, hashing what was read, so the copy needs no second read to verify."""
    hasher = Xxh3()
    view = memoryview(bytearray(CHUNK_BYTES))
    src = open_regular(source)
    try:
        dst = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            while count := os.readv(src, [view]):
                hasher.update(view[:count])
                write_all(dst, view[:count])
        finally:
            os.close(dst)
    finally:
        os.close(src)
    return hasher.hexdigest()


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a rename or creation inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(temp: Path, final: Path, *, sync_dir: bool = True) -> None:
    """fsync ``temp`` and rename it to ``final``, then fsync the directory. ``sync_dir``
    False: the caller fsyncs the directory once after several files, before anything that
    must not be durable without them (a checkpoint's manifest) is written."""
    fd = open_regular(temp)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temp, final)
    if sync_dir:
        fsync_dir(Path(final).parent)


def write_file_durably(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` under a hidden temporary name, fsync, rename over ``path``, fsync the
    directory: readers see the old content or the new, never a part."""
    _write_and_replace(Path(path), data, durable=True)


def replace_file(path: str | os.PathLike, data: bytes) -> None:
    """Like :func:`write_file_durably` for readers (old content or new, never a part) but
    without the fsyncs: for small records written from a training loop, where an fsync can
    wait behind a checkpoint's writes, and whose loss in a crash costs only what they add."""
    _write_and_replace(Path(path), data, durable=False)


def _write_and_replace(path: Path, data: bytes, *, durable: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        try:
            write_all(fd, memoryview(data))
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)  # no temp file left behind in the volume
        raise
    if durable:
        fsync_dir(path.parent)


def read_small_file(path: str | os.PathLike, max_bytes: int) -> bytes:
    """A whole small record (never blocking on a FIFO); OSError when it is absent, not a
    regular file, or larger than ``max_bytes`` (then it is not read whole)."""
    fd = open_regular(path)
    try:
        data = os.read(fd, max_bytes + 1)
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise OSError(f"larger than {max_bytes} bytes")
    return data


class Versioned(Protocol):
    # read-only: the records are frozen structs
    @property
    def version(self) -> int: ...


RecordT = TypeVar("RecordT", bound=Versioned)


def read_versioned_record(
    path: Path,
    record_type: type[RecordT],
    *,
    max_bytes: int,
    version: int,
    what: str,
    error: type[ValueError],
) -> RecordT | None:
    """A small JSON record of a volume (the retention and clean records): None when there is
    none; ``error``, one line naming ``what`` and the path, when it cannot be read, decoded
    or is of another version than this build's (its reader then trusts nothing of it)."""
    try:
        data = read_small_file(path, max_bytes)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise error(f"{what} {path}: {exc}") from exc
    try:
        record = msgspec.json.decode(data, type=record_type)
    except msgspec.DecodeError as exc:
        raise error(f"{what} {path}: {exc}") from exc
    if record.version != version:
        raise error(f"{what} {path}: version {record.version}, this build reads {version}")
    return record


def remove_dir_safely(path: Path) -> bool:
    """Rename ``path`` to a hidden trash name first (readers never see half a checkpoint),
    then delete it. False when it was already gone."""
    trash = trash_path(path)
    try:
        os.replace(path, trash)
    except FileNotFoundError:
        return False
    fsync_dir(path.parent)
    shutil.rmtree(trash, ignore_errors=True)
    return True
