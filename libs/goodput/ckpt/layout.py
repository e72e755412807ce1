"""On-disk naming and the durable-rename primitives every writer here uses.

Layout: ``<root>/step-<step:010d>/`` holds data files and ``manifest.json`` (written last).
Names starting with '.' (``.tmp-…`` being written, ``.trash-…`` being deleted) are never
checkpoints, so a reader can list the root at any moment and see only committed ones.
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path

MANIFEST_NAME = "manifest.json"
STEP_PREFIX = "step-"
TMP_PREFIX = ".tmp-"
TRASH_PREFIX = ".trash-"
_STEP_DIR = re.compile(r"^step-(\d{10})$")
_TMP_STEP_DIR = re.compile(r"^\.tmp-step-(\d{10})$")


def step_dir_name(step: int) -> str:
    return f"{STEP_PREFIX}{step:010d}"


def step_dir(root: str | os.PathLike, step: int) -> Path:
    return Path(root) / step_dir_name(step)


def tmp_step_dir(root: str | os.PathLike, step: int) -> Path:
    return Path(root) / f"{TMP_PREFIX}{step_dir_name(step)}"


def parse_step_dir(name: str) -> int | None:
    match = _STEP_DIR.match(name)
    return int(match.group(1)) if match else None


def parse_tmp_step_dir(name: str) -> int | None:
    match = _TMP_STEP_DIR.match(name)
    return int(match.group(1)) if match else None


def step_dirs(root: str | os.PathLike) -> list[tuple[int, Path]]:
    """Every ``step-*`` directory under ``root`` (complete or not), newest first."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    found = [
        (step, Path(root) / name) for name in names if (step := parse_step_dir(name)) is not None
    ]
    return sorted(found, reverse=True)


def fsync_dir(path: str | os.PathLike) -> None:
    """Make a rename or creation inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_durably(path: Path, data: bytes) -> None:
    """Write ``data`` under a temporary name, fsync, rename over ``path``, fsync the directory."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def remove_dir_safely(path: Path) -> None:
    """Rename ``path`` to a hidden trash name first (atomic disappearance), then delete it."""
    trash = path.with_name(f"{TRASH_PREFIX}{path.name}-{os.getpid()}-{time.monotonic_ns()}")
    os.replace(path, trash)
    fsync_dir(path.parent)
    shutil.rmtree(trash, ignore_errors=True)
