"""Atomic file publication: data lands under a hidden temp name and is renamed into place.

Temp names start with '.', which every reader of the checkpoint contract ignores, so no
partially-written file is ever visible under its final name.
"""

from __future__ import annotations

import os
from pathlib import Path


def partial_path(final: Path, xxh3_128: str) -> Path:
    """Deterministic temp name, keyed by the expected content, so a retry can resume it."""
    final = Path(final)
    return final.with_name(f".{final.name}.{xxh3_128[:16]}.partial")


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(temp: Path, final: Path) -> None:
    """fsync ``temp`` and rename it to ``final``, then fsync the directory."""
    fd = os.open(temp, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(temp, final)
    fsync_dir(Path(final).parent)


def atomic_write_bytes(final: Path, data: bytes) -> None:
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    temp = final.with_name(f".{final.name}.{os.getpid()}.tmp")
    with open(temp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(temp, final)
    fsync_dir(final.parent)
