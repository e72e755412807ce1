"""Where a sharded restore finds saved shards: its own step directory, and for a part of a
checkpoint spanning nodes (``goodput.checkpoint.format.parts``) the other parts staged beside it.

A rank restoring the layout it saved under needs only its own node's part. One restoring
another layout (a scale-down, a new mesh) needs other parts' shards too: those parts are staged
on the volume under ``step-N.part-KKKKK`` (by the replicator, or by hand) before the ranks
start. A staged part is used only when its manifest verifies and names the same commit, step
and tensors as the node's own part; anything else counts as missing. Every byte read from it
is still checked against its shard records' block digests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from goodput.checkpoint.format import KIND_SHARDED, Manifest, ManifestError, read_manifest
from goodput.checkpoint.format.parts import PartOf, staged_part_name, staged_parts
from goodput.checkpoint.format.parts_needed import parts_holding
from goodput.checkpoint.format.sharded import ShardRecord


@dataclass(frozen=True)
class SavedShards:
    """One directory of saved shards: the part's path, its verified manifest and (once read
    and checked) its records."""

    path: Path
    manifest: Manifest
    records: list[ShardRecord] = field(default_factory=list)

    @property
    def index(self) -> int:
        """The part it is (0 for a directory holding every rank's shards)."""
        return self.manifest.part.part if isinstance(self.manifest.part, PartOf) else 0


def _usable(staged: Manifest, own: PartOf, manifest: Manifest, index: int) -> str | None:
    """Why a staged part cannot stand in for part ``index`` of ``manifest``'s commit, or None."""
    part = staged.part
    if staged.kind != KIND_SHARDED or not isinstance(part, PartOf) or part.part != index:
        return "not that part"
    if part.commit != own.commit or staged.step != manifest.step:
        return "of another commit"
    if staged.tensors != manifest.tensors or staged.dp_world != manifest.dp_world:
        return "of another state layout"
    return None


def staged_shards(path: Path, manifest: Manifest) -> tuple[list[SavedShards], dict[int, str]]:
    """The other parts of ``manifest``'s commit staged beside ``path`` (records not read
    yet), and why each other part is missing."""
    own = manifest.part
    if not isinstance(own, PartOf):
        return [], {}
    found = staged_parts(path.parent, manifest.step)
    usable: list[SavedShards] = []
    missing: dict[int, str] = {}
    for index in range(own.count):
        if index == own.part:
            continue
        where = found.get(index)
        if where is None:
            missing[index] = "not staged"
            continue
        try:
            staged = read_manifest(where)
            why = _usable(staged, own, manifest, index)
            if why is None:
                usable.append(SavedShards(where, staged))
                continue
        except (ManifestError, OSError) as exc:
            why = str(exc)
        missing[index] = why
    return usable, missing


def lacking(
    manifest: Manifest,
    records: Sequence[ShardRecord],
    boxes: Sequence[tuple[tuple[int, ...], tuple[int, ...]]],
    missing: dict[int, str],
) -> dict[int, str]:
    """Of the ``missing`` parts, those holding shards that overlap ``boxes`` (the regions the
    rank fills, per tensor) by the saved layout, checked against the own part's ``records``
    (``format.parts_needed.parts_holding``); all of them when that layout is not predictable."""
    own = manifest.part
    if not isinstance(own, PartOf):
        return missing
    shapes = [entry.shape for entry in manifest.tensors]
    holding = parts_holding(own.table, own.part, records, shapes, boxes)
    needed = {index: why for index, why in missing.items() if holding and index in holding}
    return needed or missing


def _runs(indices: list[int]) -> str:
    """``[1, 2, 3, 7]`` as ``1..3, 7``: thousands of parts stay one readable line."""
    runs: list[list[int]] = []
    for index in indices:
        if runs and index == runs[-1][1] + 1:
            runs[-1][1] = index
        else:
            runs.append([index, index])
    return ", ".join(str(lo) if lo == hi else f"{lo}..{hi}" for lo, hi in runs)


def missing_parts_line(step: int, missing: dict[int, str]) -> str:
    """One line naming the parts a restore lacks (grouped by why), and where they belong."""
    by_why: dict[str, list[int]] = {}
    for index, why in sorted(missing.items()):
        by_why.setdefault(why, []).append(index)
    named = ", ".join(f"{_runs(indices)} ({why})" for why, indices in by_why.items())
    example = staged_part_name(step, min(missing)) if missing else ""
    return (
        f"needs shards of parts it lacks: {named}; stage them beside the node's own part "
        f"(e.g. {example}) before the ranks start"
    )
