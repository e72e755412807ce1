"""xxh3_128 file checksums, streamed with large reads (the manifest's ``xxh3_128``)."""

from __future__ import annotations

import os
from pathlib import Path

import xxhash

CHUNK_BYTES = 8 << 20


class ChecksumMismatch(ValueError):
    """Data does not hash to the checksum the manifest promises."""


def hash_file(
    path: Path, hasher: xxhash.xxh3_128 | None = None, limit: int | None = None
) -> xxhash.xxh3_128:
    """Feed the first ``limit`` bytes (all if None) of ``path`` into ``hasher``; return it."""
    hasher = hasher if hasher is not None else xxhash.xxh3_128()
    buffer = bytearray(CHUNK_BYTES)
    view = memoryview(buffer)
    remaining = limit
    with open(path, "rb", buffering=0) as f:
        while remaining is None or remaining > 0:
            want = CHUNK_BYTES if remaining is None else min(CHUNK_BYTES, remaining)
            n = f.readinto(view[:want])
            if not n:
                break
            hasher.update(view[:n])
            if remaining is not None:
                remaining -= n
    return hasher


def file_xxh3_128(path: Path) -> str:
    return hash_file(path).hexdigest()


def copy_and_hash(source: Path, dest: Path) -> str:
    """Copy in one pass, hashing what was read, so the copy needs no second read to verify."""
    hasher = xxhash.xxh3_128()
    buffer = bytearray(CHUNK_BYTES)
    view = memoryview(buffer)
    with open(source, "rb", buffering=0) as src, open(dest, "wb", buffering=0) as dst:
        while n := src.readinto(view):
            hasher.update(view[:n])
            write_all(dst.fileno(), view[:n])
    return hasher.hexdigest()


def write_all(fd: int, view: memoryview) -> None:
    """os.write may write less than asked (e.g. near a full disk); loop until done."""
    while view:
        written = os.write(fd, view)
        view = view[written:]
