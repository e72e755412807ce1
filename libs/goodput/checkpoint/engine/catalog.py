"""Which checkpoints exist under a root, which are complete, and retention of old ones."""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from goodput.checkpoint.engine.events import CheckpointRetentionDeleted, Listener, emit
from goodput.checkpoint.format import (
    TRASH_PREFIX,
    CleanRecordError,
    ManifestError,
    RetentionRecordError,
    VerifyProblem,
    check_file_sizes,
    parse_tmp_step_dir,
    read_clean_record,
    read_manifest,
    read_retention_record,
    remove_dir_safely,
    step_dir,
    step_dirs,
    verify_files,
)
from goodput.checkpoint.index.retention import clean_step, decide_retention

log = logging.getLogger(__name__)


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
    """Delete the checkpoints that retention (``goodput.checkpoint.index.retention``) lets go.

    The newest ``keep_last`` complete checkpoints are kept; when the node's replicator
    publishes a retention record in ``root``, as many as it keeps (its ``keep_local``: the
    volume has one count, whoever deletes), and older ones go only behind a newer step it
    says is safe (complete in every ``require`` tier, e.g. on a peer). A record that cannot
    be read keeps everything. The newest complete checkpoint at or before the step the ranks'
    clean record names is kept too (a numerical rollback restores it); a clean record that
    cannot be read protects nothing extra. Deletion renames to a hidden trash name first, so
    a concurrent reader never sees a half-deleted checkpoint. Stale ``.tmp-`` directories
    older than the newest complete checkpoint (left by a killed writer) and leftover trash
    are removed too.
    """
    infos = list_checkpoints(root)
    complete = [info.step for info in infos if info.complete]
    try:
        record = read_retention_record(root)
    except RetentionRecordError as exc:
        log.warning("retention deletes nothing: %s", exc)
        doomed: set[int] = set()
    else:
        safe = None if record is None else set(record.safe_steps)
        keep = keep_last if record is None or record.keep is None else record.keep
        protected = clean_step(complete, known_clean_through(root))
        decision = decide_retention([i.step for i in infos], complete, keep, safe, protected)
        for step, why in decision.kept.items():
            log.debug("retention keeps step %d: %s", step, why)
        doomed = set(decision.delete)
    deleted = []
    for info in infos:
        if info.step not in doomed:
            continue
        try:
            remove_dir_safely(info.path)
        except OSError as exc:
            log.warning("retention could not delete %s: %s", info.path, exc)
            continue
        deleted.append(info.step)
        emit(listener, CheckpointRetentionDeleted(step=info.step, path=str(info.path)))
    newest = complete[0] if complete else None
    for name in os.listdir(root):
        stale_step = parse_tmp_step_dir(name)
        if name.startswith(TRASH_PREFIX) or (
            stale_step is not None and newest is not None and stale_step < newest
        ):
            shutil.rmtree(Path(root) / name, ignore_errors=True)
    return deleted


def known_clean_through(root: str | os.PathLike) -> int | None:
    """The step the volume's ranks are known clean through; None (nothing protected) when
    there is no clean record or it cannot be trusted."""
    try:
        return read_clean_record(root)
    except CleanRecordError as exc:
        log.warning("retention protects no known-clean checkpoint: %s", exc)
        return None
