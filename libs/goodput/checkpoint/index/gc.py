"""Garbage collection across tiers: carry out what :func:`~goodput.checkpoint.index.retention.plan_gc`
decides, on node disks and in the object store, and withdraw the deleted copies from the index.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from goodput.checkpoint.format import (
    CleanRecordError,
    node_dir,
    parse_step_dir,
    read_clean_record,
    remove_dir_safely,
    step_dir,
)
from goodput.checkpoint.format.parts import parse_aside_part, parse_staged_part, staged_parts
from goodput.checkpoint.index.index import CheckpointIndex, IndexSnapshot
from goodput.checkpoint.index.records import CopyRecord
from goodput.checkpoint.index.retention import Retention, plan_gc
from goodput.checkpoint.tiers.backup import DEFAULT_PREFIX, listing_key, listing_step, read_listing
from goodput.checkpoint.tiers.object_store import ObjectNotFound, ObjectStore
from goodput.schemas.tiers import LOCAL, TIERS

log = logging.getLogger(__name__)


def delete_from_disk(node_dir: Path, copy: CopyRecord) -> None:
    """Remove one local or peer copy from a node directory (gone already is fine), and the
    parts staged beside a local one for a reshard: they go with their step."""
    root = node_dir / copy.root
    remove_dir_safely(step_dir(root, copy.step))
    if copy.tier == LOCAL:
        for staged in staged_parts(root, copy.step).values():
            remove_dir_safely(staged)


def volumes_clean_through(
    state_dir: Path, snapshot: IndexSnapshot, disks_of: Iterable[str]
) -> dict[str, int]:
    """Per node of ``disks_of``, the step its ranks are known clean through, from the clean
    record of the volume its local copies live in (a numerical rollback restores the newest
    checkpoint at or before it: :func:`plan_gc` keeps it). A record that cannot be trusted
    protects nothing extra (logged); a node without one is left out."""
    volumes = {
        (c.holder, c.root) for c in snapshot.all_copies if c.tier == LOCAL and c.holder in disks_of
    }
    clean: dict[str, int] = {}
    for holder, root in sorted(volumes):
        try:
            step = read_clean_record(node_dir(state_dir, holder) / root)
        except CleanRecordError as exc:
            log.warning("garbage collection protects no known-clean checkpoint: %s", exc)
            continue
        if step is not None:
            clean[holder] = step
    return clean


def orphaned_staged_parts(names: Iterable[str]) -> list[str]:
    """The staged parts (``step-N.part-K``) among a volume's entries whose step directory is
    not there: the engine's own retention or GC deleted the step, so they are dead weight.
    Also the parts set aside as incomplete (``.incomplete-step-N.<commit>``) once the volume
    holds a step at least as new: the job went on past them, nobody will restore them."""
    listed = set(names)
    steps = {step for name in listed if (step := parse_step_dir(name)) is not None}
    newest = max(steps, default=-1)
    return sorted(
        name
        for name in listed
        if ((parsed := parse_staged_part(name)) is not None and parsed[0] not in steps)
        or ((aside := parse_aside_part(name)) is not None and aside <= newest)
    )


def sweep_staged_parts(volume: Path) -> list[Path]:
    """Delete the volume's orphaned staged and superseded set-aside parts (run while no
    restore stages any)."""
    try:
        names = os.listdir(volume)
    except FileNotFoundError:
        return []
    doomed = [volume / name for name in orphaned_staged_parts(names)]
    for path in doomed:
        remove_dir_safely(path)
    return doomed


def delete_from_store(store: ObjectStore, copies: list[CopyRecord], in_use: set[str]) -> int:
    """Delete the listings of ``copies``, then every blob that no remaining listing names and
    that is not ``in_use`` (checksums of checkpoints the index knows of, which may be being
    backed up right now). Returns the number of blobs deleted.

    A backup racing with this sweep can still lose a blob it found present; its completeness
    check afterwards catches that, and it uploads again.
    """
    for copy in copies:
        store.delete(listing_key(copy.root, copy.step))
    referenced: set[str] = set()
    listings_prefix = f"{DEFAULT_PREFIX}/checkpoints/"
    for key in store.list(listings_prefix):
        namespace = key.removeprefix(listings_prefix).rpartition("/")[0]
        step = listing_step(key)
        if step is None:
            continue
        try:
            referenced |= {f.xxh3_128 for f in read_listing(store, namespace, step).files}
        except ObjectNotFound:
            continue
    referenced |= in_use
    deleted = 0
    for key in list(store.list(f"{DEFAULT_PREFIX}/blobs/")):
        if key.rsplit("/", 1)[-1] not in referenced:
            store.delete(key)
            deleted += 1
    return deleted


@dataclass
class GcReport:
    deleted: list[CopyRecord]
    blobs_deleted: int = 0

    def summary(self) -> str:
        counts: dict[str, int] = {}
        for c in self.deleted:
            counts[c.tier] = counts.get(c.tier, 0) + 1
        parts = [f"{n} {tier} cop{'y' if n == 1 else 'ies'}" for tier, n in sorted(counts.items())]
        return ", ".join([*parts, f"{self.blobs_deleted} blob(s)"])


async def collect_garbage(
    index: CheckpointIndex,
    snapshot: IndexSnapshot,
    retention: Retention,
    *,
    state_dir: Path,
    disks_of: set[str],
    store: ObjectStore | None,
) -> GcReport:
    """Apply :func:`plan_gc` to the node disks in ``disks_of`` (under ``state_dir``), their
    volumes' known-clean checkpoints kept, and, when ``store`` is given, to the object store;
    withdraw the deleted copies from the index."""
    clean = await asyncio.to_thread(volumes_clean_through, state_dir, snapshot, disks_of)
    doomed = plan_gc(snapshot, retention, clean)
    report = GcReport([])
    for copy in doomed:
        if TIERS[copy.tier].on_node and copy.holder in disks_of:
            await asyncio.to_thread(delete_from_disk, node_dir(state_dir, copy.holder), copy)
            await index.delete_copy(copy)
            report.deleted.append(copy)
    if store is not None:
        listings = [c for c in doomed if not TIERS[c.tier].on_node]
        if listings:
            in_use = {f.xxh3_128 for c in snapshot.all_copies for f in c.files if c not in doomed}
            report.blobs_deleted = await asyncio.to_thread(
                delete_from_store, store, listings, in_use
            )
            for copy in listings:
                await index.delete_copy(copy)
            report.deleted += listings
    return report
