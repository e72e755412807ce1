"""A numerical rollback's restore (issue 39): the newest checkpoint *before* the first step a
numerical fault may have touched (``ShimConfig.restore_before_step``, set by the actuator for
that one attempt), and the newer ones on this node's volume discarded, since they hold the
fault: a later restart would otherwise resume from them.

What it restores must still be there: the volume's writer records the last step its ranks
know clean (:func:`mark_clean`, told by the numerics monitor), and the volume's deleters keep
the newest checkpoint at or before it (``goodput.checkpoint.format.clean_record``).

Only the node's own volume is cleaned (by its local rank 0, once every rank loaded); copies
the replicator already sent to peers or the object store stay until retention drops them.
"""

from __future__ import annotations

import logging
from pathlib import Path

from goodput.checkpoint.format import (
    CleanRecordError,
    read_clean_record,
    remove_clean_record,
    write_clean_record,
)
from goodput.checkpoint.format.files import remove_dir_safely
from goodput.checkpoint.format.layout import step_dirs

log = logging.getLogger(__name__)


def bounded(latest: int | None, before_step: int | None) -> int | None:
    """The newest step a restore may start looking from: ``latest``, or the step before
    ``before_step`` when that is older (None: nothing before it, start from scratch)."""
    if latest is None or before_step is None:
        return latest
    return min(latest, before_step - 1) if before_step > 0 else None


def mark_clean(root: str | Path, step: int) -> None:
    """Record in the volume that the ranks are known clean through ``step``. A volume that
    cannot take it is logged, never fatal: retention then keeps only its newest steps."""
    try:
        write_clean_record(root, step)
    except OSError as exc:
        log.warning("could not record step %d as known clean in %s: %s", step, root, exc)


def discard_after(root: str | Path, step: int | None) -> list[int]:
    """Remove this volume's checkpoints newer than ``step`` (None: every one), and lower its
    clean record to ``step``: what the rollback left was not clean. Returns the steps removed."""
    removed = []
    for found, path in step_dirs(root):
        if (step is None or found > step) and remove_dir_safely(path):
            removed.append(found)
    if removed:
        log.warning("numerical rollback: discarded checkpoints %s of %s", removed, root)
    _lower_clean_record(root, step)
    return removed


def _lower_clean_record(root: str | Path, step: int | None) -> None:
    try:
        if step is None:
            remove_clean_record(root)
        elif (clean := read_clean_record(root)) is not None and clean > step:
            write_clean_record(root, step)
    except (OSError, CleanRecordError) as exc:
        log.warning("numerical rollback: clean record of %s not lowered: %s", root, exc)
