"""``<volume>/.goodput-clean``: the last step this node's ranks know to be numerically clean.

A numerical rollback (issue 39) restores the newest checkpoint before the first step a fault
may have touched: at the latest, the step before the window of the last fingerprint at which
every data-parallel replica agreed, no window having shown a non-finite value or a
disagreement since. The ranks know that step (``goodput.shim.numerics``); the
volume's deleters — the engine's retention and the replicator's garbage collection — do not,
and each keeps only a few newest checkpoints. So the writer of the volume's checkpoints (its
local rank 0) records the step here, and each deleter keeps the newest complete checkpoint at
or before it (:func:`goodput.checkpoint.index.retention.clean_step`): one extra step at most.

The record is read from a tier, so it may be forged or stale. It can only add one step to
what is kept, never delete: a record that cannot be trusted (:class:`CleanRecordError`) makes
its reader protect nothing extra, as if there were none. It is replaced atomically but not
fsynced (``files.replace_file``: the rank writes it from its training loop); one lost in a
crash protects nothing until the next agreed fingerprint. This module is its only reader and
writer.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import msgspec

from goodput.checkpoint.format.files import read_versioned_record, replace_file

CLEAN_RECORD_NAME = ".goodput-clean"
CLEAN_RECORD_VERSION = 1
#: a record is a few dozen bytes; anything bigger is garbage (and is not read whole)
MAX_CLEAN_RECORD_BYTES = 4096


class CleanRecordError(ValueError):
    """The record exists but is unreadable, malformed or of another version."""


class CleanRecord(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    version: int
    #: the last step at which every replica agreed, nothing suspect seen since on this volume
    step: Annotated[int, msgspec.Meta(ge=0)]


def clean_record_path(volume: str | os.PathLike) -> Path:
    return Path(volume) / CLEAN_RECORD_NAME


def write_clean_record(volume: str | os.PathLike, step: int) -> None:
    """Record that the ranks are known clean through ``step`` (replacing any older claim)."""
    record = CleanRecord(version=CLEAN_RECORD_VERSION, step=step)
    replace_file(clean_record_path(volume), msgspec.json.encode(record))


def remove_clean_record(volume: str | os.PathLike) -> None:
    """Withdraw the claim (a rollback to no checkpoint at all: nothing on it is clean)."""
    clean_record_path(volume).unlink(missing_ok=True)


def read_clean_record(volume: str | os.PathLike) -> int | None:
    """The step the volume's ranks are known clean through, or None when there is no record;
    CleanRecordError when one exists but cannot be trusted (then protect nothing extra)."""
    record = read_versioned_record(
        clean_record_path(volume),
        CleanRecord,
        max_bytes=MAX_CLEAN_RECORD_BYTES,
        version=CLEAN_RECORD_VERSION,
        what="clean record",
        error=CleanRecordError,
    )
    return None if record is None else record.step
