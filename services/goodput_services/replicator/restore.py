"""Fill a node's local volume with a complete checkpoint from the nearest tier that has it.

Sources, nearest first: the node's own volume, the copies it keeps for peers (identical
data-parallel shards are found by checksum), live peers holding the step (same block
first), then the object store. Every file is verified on arrival; a file that fails falls
through to the next source, and a step that cannot be restored falls back to the previous
complete step (unless a specific step was asked for).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

from goodput.checkpoint.format import (
    Manifest,
    ManifestError,
    local_root,
    read_manifest,
    step_dir,
    step_dir_name,
)
from goodput.checkpoint.index.index import TIER_ORDER, IndexSnapshot, StepView
from goodput.checkpoint.index.records import CopyRecord, FileRef
from goodput.checkpoint.tiers.backup import read_listing
from goodput.checkpoint.tiers.object_store import ObjectStore
from goodput.checkpoint.tiers.peer import PeerClient, PeerError
from goodput.checkpoint.tiers.restore import (
    FALLBACK_ERRORS,
    LocalSource,
    ObjectStoreSource,
    PeerSource,
    RestoreError,
    RestoreReport,
    Source,
    restore_to_volume,
)
from goodput_services.replicator.topology import block_of


@dataclass
class RestoreOutcome:
    step: int | None
    tier: str  # the farthest tier any file came from ("none": nothing to restore)
    bytes: int = 0
    seconds: float = 0.0
    fallbacks: list[str] = field(default_factory=list)
    bytes_by_tier: dict[str, int] = field(default_factory=dict)

    @property
    def detail(self) -> str:
        if self.step is None:
            return "no complete checkpoint in any tier; nothing to restore"
        tiers = ", ".join(f"{t} {b} B" for t, b in sorted(self.bytes_by_tier.items()))
        return f"step {self.step} restored from {self.tier} ({self.bytes} B moved: {tiers})"


class NothingToRestore(LookupError):
    """The asked-for step is not complete in any tier, or no candidate could be restored."""


async def restore_to_node(
    snapshot: IndexSnapshot,
    *,
    job: str,
    node: str,
    node_dir: Path,
    store: ObjectStore | None,
    step: int | None = None,
    block_label: str = "block",
) -> RestoreOutcome:
    started = time.perf_counter()
    if step is not None:
        candidates = [snapshot.view(step)]
        if not candidates[0].complete:
            raise NothingToRestore(f"step {step} is not complete in any tier")
    else:
        candidates = [v for v in snapshot.views() if v.complete]
        if not candidates:
            return RestoreOutcome(None, "none")
    fallbacks: list[str] = []
    for view in candidates:
        try:
            report = await _restore_step(snapshot, view, job, node, node_dir, store, block_label)
        except (RestoreError, NothingToRestore) as exc:
            fallbacks.append(f"step {view.step}: {exc}"[:500])
            continue
        outcome = _outcome(report, fallbacks)
        outcome.seconds = time.perf_counter() - started
        return outcome
    raise NothingToRestore("; ".join(fallbacks))


def _outcome(report: RestoreReport, fallbacks: list[str]) -> RestoreOutcome:
    by_tier = report.bytes_by_tier()
    used = {f.tier for f in report.files}
    tier = max(used, key=lambda t: TIER_ORDER[t]) if used else "local"
    failed = sorted({a.split(": ", 1)[0] for f in report.files for a in f.failed_attempts})
    return RestoreOutcome(
        report.step,
        "local" if tier == "present" else tier,
        sum(by_tier.values()),
        report.seconds,
        fallbacks + [f"{name} failed" for name in failed],
        by_tier,
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
    holders = [c for c in view.copies if c.holder != node and c.tier != "object_store"]
    me = snapshot.nodes.get(node)
    my_block = block_of(me, block_label) if me else ""
    holders.sort(
        key=lambda c: (
            block_of(snapshot.nodes[c.holder], block_label) != my_block,
            c.owner != owner,
            c.holder,
        )
    )
    peers = [
        PeerSource(snapshot.nodes[c.holder].host, snapshot.nodes[c.holder].port, c.root)
        for c in holders
    ]
    locals_ = [LocalSource(node_dir / local_root(job))] + [
        LocalSource(node_dir / c.root) for c in view.copies if c.holder == node and c.tier == "peer"
    ]
    sources: list[Source] = [*locals_, *peers]
    if store is not None:
        sources.append(ObjectStoreSource(store))
    try:
        manifest = await _find_manifest(view, owner, files, node, node_dir, store, snapshot)
        return await restore_to_volume(
            view.step, manifest.files, node_dir / local_root(job), sources, manifest=manifest
        )
    finally:
        await asyncio.gather(*(p.close() for p in peers), return_exceptions=True)


async def _find_manifest(
    view: StepView,
    owner: str,
    files: list[FileRef],
    node: str,
    node_dir: Path,
    store: ObjectStore | None,
    snapshot: IndexSnapshot,
) -> Manifest:
    """The owner's manifest, verbatim, from the nearest copy whose files match the index."""
    wanted = {(f.name, f.size, f.xxh3_128) for f in files}
    copies = sorted(
        (c for c in view.copies if c.owner == owner),
        key=lambda c: (c.holder != node, TIER_ORDER[c.tier]),
    )
    problems = []
    for copy in copies:
        try:
            manifest = await _read_manifest(copy, node, node_dir, store, snapshot)
        except (*FALLBACK_ERRORS, ManifestError) as exc:
            problems.append(f"manifest from {copy.tier}:{copy.holder}: {exc}")
            continue
        if {(f.name, f.size, f.xxh3_128) for f in manifest.files} == wanted:
            return manifest
        problems.append(f"manifest from {copy.tier}:{copy.holder} differs from the index")
    raise NothingToRestore("; ".join(problems) or f"no manifest for step {view.step}")


async def _read_manifest(
    copy: CopyRecord, node: str, node_dir: Path, store: ObjectStore | None, snapshot: IndexSnapshot
) -> Manifest:
    if copy.tier == "object_store":
        if store is None:
            raise PeerError("no object store configured")
        namespace = copy.root
        return await asyncio.to_thread(read_listing, store, namespace, copy.step)
    if copy.holder == node:
        return await asyncio.to_thread(read_manifest, step_dir(node_dir / copy.root, copy.step))
    holder = snapshot.nodes[copy.holder]
    async with await PeerClient.connect(holder.host, holder.port, timeout_s=5) as client:
        return await client.fetch_manifest(f"{copy.root}/{step_dir_name(copy.step)}")
