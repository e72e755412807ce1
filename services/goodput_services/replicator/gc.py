"""Garbage collection across tiers, driven by the index.

On each tier the newest ``keep_<tier>`` steps complete in that tier are kept, and everything
newer; older copies on that tier go, but only behind a newer step that is complete in that
tier *and* in every tier of ``require`` — until such a step exists nothing is deleted there.
The newest complete step is never deleted anywhere.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from goodput.tiers.backup import DEFAULT_PREFIX, listing_key, read_listing
from goodput.tiers.object_store import ObjectNotFound, ObjectStore
from goodput_services.replicator.holdings import STEP_PREFIX, node_dir, step_of
from goodput_services.replicator.index import CheckpointIndex, IndexSnapshot
from goodput_services.replicator.records import TIERS, CopyRecord

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Retention:
    keep: dict[str, int]
    require: tuple[str, ...] = ("peer",)


def plan_gc(snapshot: IndexSnapshot, retention: Retention) -> list[CopyRecord]:
    """The copies (of every holder) that retention says may be deleted now."""
    views = snapshot.views()
    complete = [v for v in views if v.complete]
    if not complete:
        return []
    newest_complete = complete[0].step
    qualified = [v for v in complete if all(v.complete_in(t) for t in retention.require)]
    doomed = []
    for tier in TIERS:
        safe_behind = [v.step for v in qualified if v.complete_in(tier)]
        if not safe_behind:
            continue
        kept = [v.step for v in complete if v.complete_in(tier)][: retention.keep[tier]]
        floor = min(kept[-1], safe_behind[0])
        doomed += [
            c
            for c in snapshot.all_copies
            if c.tier == tier and c.step < floor and c.step != newest_complete
        ]
    return doomed


def remove_checkpoint_dir(directory: Path) -> None:
    """Rename to a hidden trash name first (readers never see half a checkpoint), then delete."""
    trash = directory.with_name(f".trash-{directory.name}-{os.getpid()}-{time.monotonic_ns()}")
    try:
        os.replace(directory, trash)
    except FileNotFoundError:
        return
    shutil.rmtree(trash, ignore_errors=True)


def delete_from_disk(node_dir: Path, copy: CopyRecord) -> None:
    remove_checkpoint_dir(node_dir / copy.root / f"{STEP_PREFIX}{copy.step:010d}")


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
        namespace, _, name = key.removeprefix(listings_prefix).rpartition("/")
        step = step_of(name.removesuffix(".json"))
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
    """Apply :func:`plan_gc` to the node disks in ``disks_of`` (under ``state_dir``) and, when
    ``store`` is given, to the object store; withdraw the deleted copies from the index."""
    doomed = plan_gc(snapshot, retention)
    report = GcReport([])
    for copy in doomed:
        if copy.tier != "object_store" and copy.holder in disks_of:
            await asyncio.to_thread(delete_from_disk, node_dir(state_dir, copy.holder), copy)
            await index.delete_copy(copy)
            report.deleted.append(copy)
    if store is not None:
        listings = [c for c in doomed if c.tier == "object_store"]
        if listings:
            in_use = {f.xxh3_128 for c in snapshot.all_copies for f in c.files if c not in doomed}
            report.blobs_deleted = await asyncio.to_thread(
                delete_from_store, store, listings, in_use
            )
            for copy in listings:
                await index.delete_copy(copy)
            report.deleted += listings
    return report
