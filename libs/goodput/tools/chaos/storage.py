"""Storage faults on a node's checkpoint volume: a full filesystem, a corrupted checkpoint."""

from __future__ import annotations

import errno
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

#: hidden name: checkpoint readers skip names starting with '.'
BALLAST_NAME = ".goodput-chaos-ballast"
_CHUNK = 4 << 20


@dataclass(frozen=True)
class FillResult:
    ballast: Path
    added_bytes: int
    free_bytes: int


def fill_volume(volume: Path, leave_free_bytes: int) -> FillResult:
    """Grow a ballast file in ``volume`` until its filesystem has < ``leave_free_bytes`` free.

    The space is allocated for real (``posix_fallocate``, or written zeros where the
    filesystem cannot preallocate), so writers see ENOSPC just as on a full disk.
    """
    volume.mkdir(parents=True, exist_ok=True)
    ballast = volume / BALLAST_NAME
    need = shutil.disk_usage(volume).free - leave_free_bytes + 1
    added = 0
    if need > 0:
        with open(ballast, "ab") as out:
            start = out.seek(0, os.SEEK_END)
            try:
                os.posix_fallocate(out.fileno(), start, need)
                added = need
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSPC):
                    raise
                added = _write_zeros(out.fileno(), need)
            os.fsync(out.fileno())
    return FillResult(ballast, added, shutil.disk_usage(volume).free)


def _write_zeros(fd: int, size: int) -> int:
    """Fallback for filesystems without preallocation (and a partial fallocate's remainder)."""
    zeros = bytes(_CHUNK)
    written = 0
    while written < size:
        try:
            written += os.write(fd, zeros[: min(_CHUNK, size - written)])
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                break
            raise
    return written


def clear_volume(volume: Path) -> int:
    """Remove the ballast; returns the bytes given back."""
    ballast = volume / BALLAST_NAME
    try:
        size = ballast.stat().st_size
    except FileNotFoundError:
        return 0
    ballast.unlink()
    return size


@dataclass(frozen=True)
class Corruption:
    step: int
    file: Path
    offset: int
    old: int
    new: int


def corrupt_newest_checkpoint(volume: Path, step: int | None = None) -> Corruption:
    """Flip one byte in the middle of a data file of the newest (or given) checkpoint.

    Sizes stay the same, so only a checksum can tell: what restore verification must catch.
    """
    from goodput.checkpoint.engine.catalog import list_checkpoints
    from goodput.checkpoint.format import ManifestError, read_manifest

    infos = [info for info in list_checkpoints(volume) if step is None or info.step == step]
    complete = [info for info in infos if info.complete]
    if not complete:
        what = f"step {step}" if step is not None else "any step"
        raise FileNotFoundError(f"no complete checkpoint of {what} in {volume}")
    target = complete[0]
    try:
        manifest = read_manifest(target.path)
    except ManifestError as exc:
        raise FileNotFoundError(f"checkpoint {target.path} lost its manifest: {exc}") from exc
    entries = [entry for entry in manifest.files if entry.size > 0]
    if not entries:
        raise FileNotFoundError(f"checkpoint {target.path} has no data bytes to corrupt")
    entry = max(entries, key=lambda e: e.size)
    path = target.path / entry.name
    offset = entry.size // 2
    with open(path, "r+b") as data:
        data.seek(offset)
        old = data.read(1)[0]
        new = old ^ 0xFF
        data.seek(offset)
        data.write(bytes([new]))
        data.flush()
        os.fsync(data.fileno())
    return Corruption(step=target.step, file=path, offset=offset, old=old, new=new)
