"""Fill a node's local volume with a complete checkpoint from the nearest tier that has it.

Sources, nearest first (:mod:`.restore_sources`): the node's own volume, the copies it keeps
for peers (identical data-parallel shards are found by checksum), live peers holding the step
(same block first), then the object store. Every file is verified on arrival; a file that
fails falls through to the next source, and a step that cannot be restored falls back to the
previous complete step (unless a specific step was asked for). A checkpoint sharded across
nodes is restored part by part (:mod:`.restore_parts`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from goodput import schemas
from goodput.checkpoint.format import local_root
from goodput.checkpoint.format.parts import parse_staged_part
from goodput.checkpoint.index.index import IndexSnapshot, StepView
from goodput.checkpoint.tiers.object_store import ObjectStore
from goodput.checkpoint.tiers.restore import RestoreError, RestoreReport, restore_to_volume
from goodput.schemas.tiers import LOCAL, TIERS, RestoredFrom, StorageTier
from goodput_services.replicator.restore_parts import NodePart, stage_parts
from goodput_services.replicator.restore_sources import (
    NothingToRestore,
    close_all,
    copy_sources,
    find_manifest,
)

__all__ = ["NothingToRestore", "RestoreOutcome", "restore_to_node"]


@dataclass
class RestoreOutcome:
    step: int | None
    #: the farthest tier any file came from ("none": nothing to restore)
    tier: RestoredFrom
    bytes: int = 0
    seconds: float = 0.0
    fallbacks: list[str] = field(default_factory=list)
    bytes_by_tier: dict[str, int] = field(default_factory=dict)
    #: the parts staged beside the node's own (a reshard of a checkpoint sharded across nodes)
    staged: list[int] = field(default_factory=list)

    def event(self, job: str, node: str) -> schemas.CheckpointRestored:
        """What the replicator reports for a restore it made (rank -1: before any rank)."""
        assert self.step is not None
        return schemas.CheckpointRestored(
            job=job,
            node=node,
            rank=-1,
            step=self.step,
            tier=self.tier,
            duration_s=self.seconds,
            bytes=self.bytes,
            fallbacks=self.fallbacks,
        )

    @property
    def detail(self) -> str:
        if self.step is None:
            return "no complete checkpoint in any tier; nothing to restore"
        tiers = ", ".join(f"{t} {b} B" for t, b in sorted(self.bytes_by_tier.items()))
        detail = f"step {self.step} restored from {self.tier} ({self.bytes} B moved: {tiers})"
        if self.staged:
            noun = "part" if len(self.staged) == 1 else "parts"
            detail += f"; {noun} {', '.join(map(str, self.staged))} staged beside it"
        return detail


async def restore_to_node(
    snapshot: IndexSnapshot,
    *,
    job: str,
    node: str,
    node_dir: Path,
    store: ObjectStore | None,
    step: int | None = None,
    block_label: str = "block",
    assigned: NodePart | None = None,
    before_step: int | None = None,
) -> RestoreOutcome:
    """Restore the newest complete step (or ``step``; before ``before_step``, a numerical
    rollback's bound, when given) onto the node's volume; for a checkpoint sharded across
    nodes, the part ``assigned`` to the node (and, for a reshard, beside it the other parts
    its new ranks read)."""
    started = time.perf_counter()
    if step is not None:
        candidates = [snapshot.view(step)]
        if not candidates[0].complete:
            raise NothingToRestore(f"step {step} is not complete in any tier")
        if before_step is not None and step >= before_step:
            raise NothingToRestore(f"step {step} is not before step {before_step}")
    else:
        candidates = [
            v
            for v in snapshot.views()
            if v.complete and (before_step is None or v.step < before_step)
        ]
        if not candidates:
            return RestoreOutcome(None, "none")
    fallbacks: list[str] = []
    for view in candidates:
        try:
            if view.complete_owners():
                reports = [
                    await _restore_step(snapshot, view, job, node, node_dir, store, block_label)
                ]
            else:
                volume = node_dir / local_root(job)
                reports = await stage_parts(
                    snapshot, view, node, volume, node_dir, store, block_label, assigned
                )
        except (RestoreError, NothingToRestore) as exc:
            fallbacks.append(f"step {view.step}: {exc}"[:500])
            continue
        outcome = _outcome(reports, fallbacks)
        outcome.seconds = time.perf_counter() - started
        return outcome
    raise NothingToRestore("; ".join(fallbacks))


def _outcome(reports: list[RestoreReport], fallbacks: list[str]) -> RestoreOutcome:
    files = [f for report in reports for f in report.files]
    by_tier: dict[str, int] = {}
    for f in files:
        by_tier[f.tier] = by_tier.get(f.tier, 0) + f.bytes_moved
    tier: StorageTier = max((f.tier for f in files), key=lambda t: TIERS[t].nearness, default=LOCAL)
    failed = sorted({a.split(": ", 1)[0] for f in files for a in f.failed_attempts})
    staged = [parsed[1] for r in reports if (parsed := parse_staged_part(r.directory.name))]
    return RestoreOutcome(
        reports[0].step,
        tier,
        sum(by_tier.values()),
        sum(report.seconds for report in reports),
        fallbacks + [f"{name} failed" for name in failed],
        by_tier,
        staged,
    )


async def _restore_step(
    snapshot: IndexSnapshot,
    view: StepView,
    job: str,
    node: str,
    node_dir: Path,
    store: ObjectStore | None,
    block_label: str,
) -> RestoreReport:
    owner = view.owner_for(node)
    if owner is None:
        raise NothingToRestore(f"step {view.step} is not complete")
    files = [loc.file for loc in view.owners[owner]]
    # identical data-parallel copies of other owners serve too (files match by checksum)
    sources, peers = copy_sources(
        snapshot,
        view.copies,
        node,
        node_dir / local_root(job),
        node_dir,
        store,
        block_label,
        prefer=lambda c: c.owner != owner,
    )
    try:
        own = [c for c in view.copies if c.owner == owner]
        manifest = await find_manifest(own, files, node, node_dir, store, snapshot)
        return await restore_to_volume(
            view.step, manifest.files, node_dir / local_root(job), sources, manifest=manifest
        )
    finally:
        await close_all(peers)
