"""Which checkpoints exist under a root, which are complete, and retention of old ones."""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from goodput.ckpt.events import CheckpointRetentionDeleted, Listener, emit
from goodput.ckptfmt import (
    TRASH_PREFIX,
    ManifestError,
    VerifyProblem,
    check_file_sizes,
    parse_tmp_step_dir,
    read_manifest,
    remove_dir_safely,
    step_dir,
    step_dirs,
    verify_files,
)

log = logging.getLogger(__name__)

#: complete checkpoints a root keeps (engine, DCP writer, torch.save baseline, shim config)
DEFAULT_KEEP_LAST = 3


@dataclass(frozen=True)
class CheckpointInfo:
    """One ``step-*`` directory. ``complete``: valid manifest and every file at its size."""

    step: int
    path: Path
    complete: bool
    kind: str | None = None
    bytes: int = 0
    problem: str | None = None


def list_checkpoints(root: str | os.PathLike) -> list[CheckpointInfo]:
    """Every checkpoint directory under ``root``, newest first (cheap: no data is read)."""
    infos = []
    for step, path in step_dirs(root):
        try:
            manifest = read_manifest(path)
        except ManifestError as exc:
            infos.append(CheckpointInfo(step, path, complete=False, problem=str(exc)))
            continue
        problems = check_file_sizes(path, manifest)
        if manifest.step != step:
            problems.append(VerifyProblem("manifest.json", f"says step {manifest.step}"))
        infos.append(
            CheckpointInfo(
                step,
                path,
                complete=not problems,
                kind=manifest.kind,
                bytes=manifest.total_bytes,
                problem="; ".join(map(str, problems)) or None,
            )
        )
    return infos


def latest_complete_step(root: str | os.PathLike) -> int | None:
    return next((info.step for info in list_checkpoints(root) if info.complete), None)


def verify_checkpoint(root: str | os.PathLike, step: int) -> list[VerifyProblem]:
    """Full verification (reads every byte) of the checkpoint for ``step``."""
    return verify_files(step_dir(root, step))


def apply_retention(
    root: str | os.PathLike, keep_last: int, listener: Listener | None = None
) -> list[int]:
    """Keep the newest ``keep_last`` complete checkpoints; delete what is older.

    Deletion renames to a hidden trash name first, so a concurrent reader never sees a
    half-deleted checkpoint. Stale ``.tmp-`` directories older than the newest complete
    checkpoint (left by a killed writer) and leftover trash are removed too.
    """
    infos = list_checkpoints(root)
    complete = [info for info in infos if info.complete]
    if keep_last < 1 or len(complete) <= keep_last:
        oldest_kept = complete[-1].step if complete else None
    else:
        oldest_kept = complete[keep_last - 1].step
    deleted = []
    if oldest_kept is not None:
        for info in infos:
            if info.step >= oldest_kept:
                continue
            try:
                remove_dir_safely(info.path)
            except OSError as exc:
                log.warning("retention could not delete %s: %s", info.path, exc)
                continue
            deleted.append(info.step)
            emit(listener, CheckpointRetentionDeleted(step=info.step, path=str(info.path)))
    newest = complete[0].step if complete else None
    for name in os.listdir(root):
        stale_step = parse_tmp_step_dir(name)
        if name.startswith(TRASH_PREFIX) or (
            stale_step is not None and newest is not None and stale_step < newest
        ):
            shutil.rmtree(Path(root) / name, ignore_errors=True)
    return deleted
