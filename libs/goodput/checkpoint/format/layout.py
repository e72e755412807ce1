"""Where checkpoints live: step directory names, hidden temp names, and the node layout.

A checkpoint is ``<root>/step-<step:010d>/`` holding data files and ``manifest.json``
(written last). Names starting with '.' (``.tmp-…`` being written, ``.trash-…`` being
deleted, ``.<file>.<checksum>.partial`` being received) are never checkpoints or data
files, so a reader can list a root at any moment and see only committed ones. This module is
the only place that formats or parses those names.

Node layout: everything a node stores is under ``<state>/nodes/<node>/`` (its peer server
serves that directory): its own checkpoints in ``checkpoints/<job>`` (the volume training
sees) and the copies it keeps for peers in ``peer/<job>/<owner>``.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

from goodput.state_dir import StateDir

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
    """The step of a committed-checkpoint directory name, None for anything else."""
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


def is_temp_name(name: str) -> bool:
    """A name writers use while a file or directory is not final (never checkpoint data).

    Every such name is hidden and either carries a second dot (``.<file>.<pid>.tmp``,
    ``.<file>.<checksum>.partial``) or is a ``.tmp…``/``.trash…`` name; a plain hidden name
    such as DCP's ``.metadata`` is data.
    """
    return name.startswith(".") and (
        "." in name[1:] or name.startswith((".tmp", TRASH_PREFIX)) or len(name) == 1
    )


def trash_path(path: Path) -> Path:
    """A hidden, unique name to rename ``path`` to before deleting it."""
    return path.with_name(f"{TRASH_PREFIX}{path.name}-{os.getpid()}-{time.monotonic_ns()}")


def partial_path(final: Path, xxh3_128: str) -> Path:
    """Deterministic temp name, keyed by the expected content, so a retry can resume it."""
    final = Path(final)
    return final.with_name(f".{final.name}.{xxh3_128[:16]}.partial")


def node_dir(state_dir: str | os.PathLike, node: str) -> Path:
    """Everything a node stores; its peer server serves this directory."""
    return StateDir(Path(state_dir)).node(node)


def local_root(job: str) -> str:
    """Where a node keeps its own checkpoints, relative to its node directory."""
    return f"checkpoints/{job}"


def peer_root(job: str, owner: str) -> str:
    """Where a node keeps the copies it holds of ``owner``'s checkpoints."""
    return f"peer/{job}/{owner}"


def node_volume(state_dir: str | os.PathLike, node: str, job: str) -> Path:
    """Where a node keeps its checkpoints: one directory per node, as on real hosts."""
    return node_dir(state_dir, node) / local_root(job)
