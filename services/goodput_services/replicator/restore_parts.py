"""Stage a node's part of a checkpoint sharded across nodes onto its volume before launch.

The node holds, as ``step-N``, the part of its place in the new launch order (``NodePart``,
from ``RestoreToNode``): a hot-swapped spare gets the failed node's part. When the new node
count differs from the checkpoint's part count (a reshard), the node's new ranks read the old
shards that overlap their new ones: the node's own part is staged first (as ``step-N``), then
its verified shard records say where the new shards lie
(:func:`goodput.checkpoint.format.parts_needed.parts_needed`: the same mesh, its outer
dimension scaled, checked against those records), and only the other parts holding an
overlapping shard are staged beside it as ``step-N.part-K``
(``goodput.checkpoint.format.parts.staged_part_dir``): for FSDP2 going N -> N-1 at most two
per tensor, often none besides its own; none for HSDP with a replica per node. When the layout cannot be predicted (a
placement the rule does not know, a mesh that does not scale, records that disagree with the
rule) every part is staged, as before, and the plan's reason says why.

Each part comes from the nearest holder of that very part of that commit (:mod:`.restore_sources`),
verified per file, so a part whose file is corrupt on the volume is fetched again alone.
Whether to hold, stage or move a part is :func:`plan_parts`'s pure decision.

For a reshard, the node's own parts of newer steps whose commit the index does not hold
complete (a node lost with the only copy of its part) are then set aside under a hidden name
(:func:`goodput.checkpoint.format.parts.aside_part_dir`, :func:`set_aside`): every rank of a
scale-down still holds its own part of such a step, so the ranks would agree on it first
and restore it in vain (its other parts are not staged) before falling back together. Only
for a reshard: with the same layout a newer step every node holds is the ranks' to use, and
a snapshot taken before another node indexed its part would wrongly call it incomplete.
Kept, not deleted: the GC sweep removes it once the volume holds a step at least as new.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from goodput.checkpoint.format import (
    Manifest,
    ManifestError,
    fsync_dir,
    read_manifest,
    remove_dir_safely,
    step_dir,
    step_dirs,
)
from goodput.checkpoint.format.parts import MAX_PARTS, PartOf, aside_part_dir, staged_part_dir
from goodput.checkpoint.format.parts_needed import NeededParts, parts_needed
from goodput.checkpoint.format.sharded import read_records
from goodput.checkpoint.index.index import Commit, IndexSnapshot, StepView
from goodput.checkpoint.index.records import CopyRecord
from goodput.checkpoint.tiers.object_store import ObjectStore
from goodput.checkpoint.tiers.restore import RestoreReport, restore_to_volume
from goodput_services.replicator.restore_sources import (
    NothingToRestore,
    close_all,
    copy_sources,
    find_manifest,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodePart:
    """The part a node holds in the new membership, and the new part (node) count."""

    part: int
    parts: int

    def __post_init__(self) -> None:
        if not 0 <= self.part < self.parts <= MAX_PARTS:
            raise NothingToRestore(f"part {self.part} of {self.parts} parts")

    @classmethod
    def of(cls, part: int | None, parts: int | None) -> NodePart | None:
        """From ``RestoreToNode``: None when it names no part (a whole checkpoint, or the
        part already on the volume). Raises NothingToRestore for an impossible one."""
        return None if part is None or parts is None else cls(part, parts)


@dataclass(frozen=True)
class PartPlan:
    """What to put on the volume: ``own`` as ``step-N``, ``staged``
    beside it; ``move_aside``: ``step-N`` holds another part of the commit, which is kept
    under its staged name rather than overwritten (it may be that part's only copy)."""

    own: int
    staged: tuple[int, ...] = ()
    move_aside: int | None = None
    reason: str = ""


def plan_parts(count: int, assigned: NodePart | None, on_volume: int | None) -> PartPlan:
    """The parts of a commit of ``count`` parts this node needs, given what ``step-N`` on its
    volume holds now (``on_volume``: a part of this commit, or None).

    Raises NothingToRestore when the node's part is unknown and nothing on its volume says."""
    if assigned is None:
        if on_volume is None:
            raise NothingToRestore(
                f"the checkpoint is sharded across nodes in {count} parts and the node's part"
                " is not known (RestoreToNode.part)"
            )
        return PartPlan(on_volume, reason=f"part {on_volume}, already on the volume")
    if assigned.parts == count:
        moved = on_volume if on_volume not in (None, assigned.part) else None
        return PartPlan(assigned.part, move_aside=moved, reason=f"part {assigned.part}")
    # a reshard: every part is read; the one already on the volume stays where it is, and
    # one always is there (staged parts without their step are swept as orphans)
    own = on_volume if on_volume is not None else min(assigned.part, count - 1)
    staged = tuple(p for p in range(count) if p != own)
    return PartPlan(own, staged, reason=f"reshard {count} -> {assigned.parts} parts")


def narrow(plan: PartPlan, needed: NeededParts) -> PartPlan:
    """A reshard's plan staging only the parts ``needed`` (all of them when it is None)."""
    keep = (
        plan.staged if needed.parts is None else tuple(p for p in plan.staged if p in needed.parts)
    )
    return dataclasses.replace(plan, staged=keep, reason=f"{plan.reason}: {needed.reason}")


def needed_by(directory: Path, assigned: NodePart) -> NeededParts:
    """:func:`parts_needed` for the node's new place, from the part staged in ``directory``
    (its manifest and shard records, verified as read)."""
    try:
        manifest = read_manifest(directory)
        records = read_records(directory, manifest)
    except (ManifestError, OSError) as exc:
        return NeededParts(None, f"every part staged: its own part's records unreadable ({exc})")
    part = manifest.part
    if not isinstance(part, PartOf):  # replaced since it was staged as that part
        return NeededParts(None, "every part staged: its own part is no part any more")
    shapes = [entry.shape for entry in manifest.tensors]
    return parts_needed(part.table, part.part, records, shapes, assigned.part, assigned.parts)


def part_on_volume(directory: Path, commit: Commit) -> tuple[int | None, bool]:
    """(which part of ``commit`` the step directory holds, or None; whether it is committed
    as another checkpoint of the step instead)."""
    try:
        manifest = read_manifest(directory)
    except ManifestError:
        return None, False  # absent, or not committed: files already right are kept
    part = manifest.part
    if isinstance(part, PartOf) and (part.commit, part.count) == commit:
        return part.part, False
    return None, True


def incomplete_newer(
    staged: int, on_volume: dict[int, Commit | None], complete: Callable[[int], Commit | None]
) -> list[int]:
    """The steps newer than ``staged`` whose part on the volume (its commit, by step) belongs
    to no complete commit of that step by the index (``complete``): the ranks must not
    offer them. A directory that is not a part (None) is left alone."""
    return sorted(
        step
        for step, commit in on_volume.items()
        if step > staged and commit is not None and complete(step) != commit
    )


def _parts_on_volume(volume: Path) -> dict[int, Commit | None]:
    """The commit of each step directory's part on the volume (None: not a part)."""
    found: dict[int, Commit | None] = {}
    for step, directory in step_dirs(volume):
        try:
            part = read_manifest(directory).part
        except ManifestError:
            part = None
        found[step] = (part.commit, part.count) if isinstance(part, PartOf) else None
    return found


def set_aside(volume: Path, staged: int, view_of: Callable[[int], StepView]) -> list[int]:
    """Move the node's parts of newer steps that can never complete out of the ranks' sight
    (:func:`incomplete_newer`); returns their steps."""
    commits = _parts_on_volume(volume)
    doomed = incomplete_newer(staged, commits, lambda step: view_of(step).complete_commit())
    for step in doomed:
        commit = commits[step]
        assert commit is not None
        aside = aside_part_dir(volume, step, commit[0])
        remove_dir_safely(aside)  # the same commit set aside before (a restore repeated)
        step_dir(volume, step).rename(aside)
        log.info("step %d: this node's part belongs to no complete commit; set aside", step)
    if doomed:
        fsync_dir(volume)
    return doomed


async def stage_parts(
    snapshot: IndexSnapshot,
    view: StepView,
    node: str,
    volume: Path,
    node_dir: Path,
    store: ObjectStore | None,
    block_label: str,
    assigned: NodePart | None,
) -> list[RestoreReport]:
    """Put the parts :func:`plan_parts` decides on ``volume``; a report per part staged."""
    commit = view.complete_commit()
    if commit is None:
        raise NothingToRestore(f"step {view.step} has no complete commit")
    own_dir = step_dir(volume, view.step)
    on_volume, foreign = await asyncio.to_thread(part_on_volume, own_dir, commit)
    plan = plan_parts(commit[1], assigned, on_volume)
    if plan.move_aside is not None:
        await asyncio.to_thread(
            _move_aside, own_dir, staged_part_dir(volume, view.step, plan.move_aside)
        )
    elif foreign:
        # a commit of this step that is not the complete one (a node was lost during its
        # global commit: it can never complete): its files would mix with the part staged here
        await asyncio.to_thread(remove_dir_safely, own_dir)
    here = (node, volume, node_dir, store, block_label)
    reports = [await _stage(snapshot, view, commit, plan.own, own_dir, *here)]
    if plan.staged:  # a reshard: only the parts holding shards the node's new ranks read
        assert assigned is not None
        plan = narrow(plan, await asyncio.to_thread(needed_by, own_dir, assigned))
    log.info("step %d: %s", view.step, plan.reason)
    for part in plan.staged:
        into = staged_part_dir(volume, view.step, part)
        reports.append(await _stage(snapshot, view, commit, part, into, *here))
    if assigned is not None and assigned.parts != commit[1]:
        # a reshard: a newer step's own part is of no use without the others
        await asyncio.to_thread(set_aside, volume, view.step, snapshot.view)
    return reports


def _move_aside(directory: Path, staged: Path) -> None:
    remove_dir_safely(staged)
    directory.rename(staged)


async def _stage(
    snapshot: IndexSnapshot,
    view: StepView,
    commit: Commit,
    part: int,
    into: Path,
    node: str,
    volume: Path,
    node_dir: Path,
    store: ObjectStore | None,
    block_label: str,
) -> RestoreReport:
    """Fill ``into`` with ``part`` of ``commit``, from its nearest copy, file by file."""
    copies = view.part_copies(part)
    if not copies:
        raise NothingToRestore(f"step {view.step}: no copy of part {part}")

    def is_that_part(manifest: Manifest) -> str:
        got = manifest.part
        if not isinstance(got, PartOf) or (got.commit, got.count, got.part) != (*commit, part):
            return f"not part {part} of commit {commit[0]}"
        return ""

    sources, peers = copy_sources(snapshot, copies, node, volume, node_dir, store, block_label)
    try:
        manifest = await _part_manifest(copies, node, node_dir, store, snapshot, is_that_part)
        return await restore_to_volume(
            view.step, manifest.files, volume, sources, manifest=manifest, directory=into
        )
    finally:
        await close_all(peers)


async def _part_manifest(
    copies: tuple[CopyRecord, ...],
    node: str,
    node_dir: Path,
    store: ObjectStore | None,
    snapshot: IndexSnapshot,
    accept: Callable[[Manifest], str],
) -> Manifest:
    """The part's manifest from the nearest copy; records read from the bus may disagree
    (one forged or stale), so each distinct file set is tried, nearest first."""
    problems = []
    for files in dict.fromkeys(c.checksums() for c in copies):
        matching = [c for c in copies if c.checksums() == files]
        try:
            return await find_manifest(
                matching, matching[0].files, node, node_dir, store, snapshot, accept
            )
        except NothingToRestore as exc:
            problems.append(str(exc))
    raise NothingToRestore("; ".join(problems))
