"""``<volume>/.goodput-retention``: which local checkpoints the replicator says are safe.

The ranks' checkpoint engine deletes old checkpoints from its volume but has no bus, so the
node's replicator tells it through the volume: after each index sync it writes this record
(atomically: temp file, fsync, rename) with the ``require`` tiers, the steps complete in
every one of them and how many complete checkpoints the volume keeps (the replicator's
``keep_local``). The engine then keeps as many and deletes only behind a safe step
(:func:`goodput.checkpoint.index.retention.decide_retention`): the volume's two deleters keep
one count. No record: no replicator serves the volume, and the engine's own plain
keep-newest rule applies. This module is the only reader and writer.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated

import msgspec

from goodput.checkpoint.format.files import (
    read_small_file,
    read_versioned_record,
    write_file_durably,
)

RETENTION_RECORD_NAME = ".goodput-retention"
RETENTION_RECORD_VERSION = 1
#: a record lists a handful of steps; anything bigger is garbage (and is not read whole)
MAX_RECORD_BYTES = 1 << 20


class RetentionRecordError(ValueError):
    """The record exists but is unreadable, malformed or of another version."""


class RetentionRecord(msgspec.Struct, frozen=True, kw_only=True):
    version: int
    #: the tiers a step must be complete in to be safe (the replicator's ``gc_require``)
    require: tuple[str, ...]
    #: steps complete in every ``require`` tier, newest first
    safe_steps: tuple[int, ...]
    #: complete checkpoints the volume keeps (the replicator's ``keep_local``); None in a
    #: record of an earlier release (the engine then keeps its own count)
    keep: Annotated[int, msgspec.Meta(ge=1)] | None = None


def retention_record_path(volume: str | os.PathLike) -> Path:
    return Path(volume) / RETENTION_RECORD_NAME


def encode_retention_record(
    require: Iterable[str], safe_steps: Iterable[int], *, keep: int
) -> bytes:
    record = RetentionRecord(
        version=RETENTION_RECORD_VERSION,
        require=tuple(require),
        safe_steps=tuple(sorted(set(safe_steps), reverse=True)),
        keep=keep,
    )
    return msgspec.json.encode(record)


def write_retention_record(
    volume: str | os.PathLike, require: Iterable[str], safe_steps: Iterable[int], *, keep: int
) -> bool:
    """Publish the record unless the volume already holds exactly it; True when written."""
    data = encode_retention_record(require, safe_steps, keep=keep)
    path = retention_record_path(volume)
    try:
        if read_small_file(path, MAX_RECORD_BYTES) == data:
            return False
    except OSError:
        pass  # absent (a new or wiped volume) or damaged: write it
    write_file_durably(path, data)
    return True


def read_retention_record(volume: str | os.PathLike) -> RetentionRecord | None:
    """The volume's record, or None when there is none; RetentionRecordError when it exists
    but cannot be trusted (its reader must then delete nothing)."""
    return read_versioned_record(
        retention_record_path(volume),
        RetentionRecord,
        max_bytes=MAX_RECORD_BYTES,
        version=RETENTION_RECORD_VERSION,
        what="retention record",
        error=RetentionRecordError,
    )
