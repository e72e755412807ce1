"""Which parts of a commit a node's ranks read after a reshard: a pure prediction, checked.

A reshard (another node count) used to stage every part on every node: at 2,048 nodes a
scale-down moved the whole checkpoint onto each. A new node's ranks only read the old shards
that overlap their new ones. :func:`parts_needed` predicts the new layout as **the same mesh
with its outermost dimension scaled** to the new world (``parts_new x ranks per part``: FSDP2's
1-D mesh, HSDP's replicate dimension), computes with :mod:`.placement`'s rule the new node's
ranks' boxes and the old boxes overlapping them, and returns the parts holding those.

The prediction is trusted only where it is checked: every tensor's shards in the node's own
part (verified records) must sit exactly where the rule puts those ranks under the old mesh,
every placement must be one the rule knows, the mesh must cover the commit's ranks and scale
to a whole outer dimension, and every part must hold as many ranks. Otherwise the answer is
None with the reason, and the caller stages every part as before. A wrong prediction of an
*other* part (a forged record there) costs a rank one clear error naming the parts it lacks,
never a wrong byte: the engine verifies every byte it reads against the records.

Cost: per tensor, the own ranks' boxes (checked) and, per new rank, only the old shards that
overlap it (a range computed per mesh dimension, never a loop over the old ranks); tensors of
one shape and layout share one answer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from goodput.checkpoint.format.parts import PartSummary
from goodput.checkpoint.format.placement import (
    Placement,
    mesh_coordinate,
    mesh_rank,
    overlapping_coordinates,
    parse_placements,
    shard_box,
)
from goodput.checkpoint.format.sharded import ShardPiece, ShardRecord


@dataclass(frozen=True)
class NeededParts:
    """The parts holding a shard the new node's ranks read (None: cannot be predicted)."""

    parts: frozenset[int] | None
    reason: str


#: a region of a global tensor: (offsets, shape)
Box = tuple[tuple[int, ...], tuple[int, ...]]


class _Unpredictable(Exception):
    """Why the prediction cannot be trusted (the message is the reason)."""


@dataclass(frozen=True)
class _Layout:
    """How one tensor was saved: its global shape, mesh and placements."""

    shape: tuple[int, ...]
    mesh: tuple[int, ...]
    placements: tuple[Placement, ...]


def parts_needed(
    table: Sequence[PartSummary],
    own: int,
    records: Sequence[ShardRecord],
    shapes: Sequence[Sequence[int]],
    place: int,
    parts_new: int,
) -> NeededParts:
    """The parts of the commit ``table`` whose shards overlap those of node ``place`` of
    ``parts_new`` (the own part included when it does). ``records``: the shard records of
    part ``own`` (verified), ``shapes``: every tensor's global shape (its manifest's)."""
    try:
        parts = _predict(table, own, records, shapes, place, parts_new)
    except _Unpredictable as exc:
        return NeededParts(None, f"every part staged: {exc}")
    listed = ", ".join(map(str, sorted(parts))) or "none"
    return NeededParts(
        frozenset(parts),
        f"node {place} of {parts_new} reads parts {listed} ({len(parts)} of {len(table)})",
    )


def parts_holding(
    table: Sequence[PartSummary],
    own: int,
    records: Sequence[ShardRecord],
    shapes: Sequence[Sequence[int]],
    boxes: Sequence[Box | None],
) -> frozenset[int] | None:
    """The parts holding the saved shards that overlap ``boxes`` (per tensor, the region a
    rank fills; None: nothing), by the saved layout checked against part ``own``'s records;
    None when that layout cannot be trusted. A rank lacking parts names those it needs."""
    own_ranks = {record.rank for record in records}
    parts: set[int] = set()
    try:
        part_of, world = _ranks_of(table)
        for layout, box in zip(_layouts(records, shapes, world), boxes, strict=True):
            if layout is not None and box is not None:
                parts |= _holders(layout, [box], own, own_ranks, part_of)
    except _Unpredictable:
        return None
    return frozenset(parts)


def _ranks_of(table: Sequence[PartSummary]) -> tuple[dict[int, int], int]:
    """Each global rank's part, and the commit's world size."""
    part_of = {rank: summary.part for summary in table for rank in summary.ranks}
    return part_of, len(part_of)


def _predict(
    table: Sequence[PartSummary],
    own: int,
    records: Sequence[ShardRecord],
    shapes: Sequence[Sequence[int]],
    place: int,
    parts_new: int,
) -> set[int]:
    per_part = {len(summary.ranks) for summary in table}
    if len(per_part) != 1:
        raise _Unpredictable("parts hold unequal numbers of ranks")
    ranks = per_part.pop()
    part_of, world = _ranks_of(table)
    layouts = _layouts(records, shapes, world)
    own_ranks = {record.rank for record in records}
    new_ranks = range(place * ranks, (place + 1) * ranks)
    needed: set[int] = set()
    answers: dict[_Layout, set[int]] = {}
    for layout in layouts:
        if layout is None:
            continue  # a plain tensor: every part holds it whole
        if layout not in answers:
            boxes = _new_boxes(layout, new_ranks, ranks * parts_new)
            answers[layout] = _holders(layout, boxes, own, own_ranks, part_of)
        needed |= answers[layout]
    return needed


def _layouts(
    records: Sequence[ShardRecord], shapes: Sequence[Sequence[int]], world: int
) -> list[_Layout | None]:
    """Each tensor's layout, checked against the own part's shards (None: a plain tensor)."""
    pieces: list[list[tuple[int, ShardPiece]]] = [[] for _ in shapes]
    for record in records:
        for piece in record.pieces:
            if not 0 <= piece.tensor < len(shapes):
                raise _Unpredictable(
                    f"rank {record.rank}: a shard of unknown tensor {piece.tensor}"
                )
            pieces[piece.tensor].append((record.rank, piece))
    layouts: list[_Layout | None] = []
    for tensor, held in enumerate(pieces):
        if not held:
            raise _Unpredictable(f"tensor {tensor}: no shard in the node's own part")
        if all(not piece.placement for _, piece in held):
            layouts.append(None)
            continue
        layouts.append(_checked_layout(tensor, tuple(shapes[tensor]), held, world))
    return layouts


def _checked_layout(
    tensor: int, shape: tuple[int, ...], held: list[tuple[int, ShardPiece]], world: int
) -> _Layout:
    """The layout of a DTensor, after checking the rule puts each own shard where it is."""
    first = held[0][1]
    if any((p.placement, p.mesh) != (first.placement, first.mesh) for _, p in held):
        raise _Unpredictable(f"tensor {tensor}: its shards name different placements or meshes")
    mesh = tuple(first.mesh)
    placements = parse_placements(first.placement, mesh)
    if placements is None or any(dim is not None and dim >= len(shape) for dim in placements):
        raise _Unpredictable(f"tensor {tensor}: placement {first.placement!r} is not predictable")
    if not mesh or any(size < 1 for size in mesh) or math.prod(mesh) != world:
        raise _Unpredictable(
            f"tensor {tensor}: mesh {list(mesh)} is not the commit's {world} ranks"
        )
    if len({rank for rank, _ in held}) != len(held):
        raise _Unpredictable(f"tensor {tensor}: a rank holds two shards of it")
    for rank, piece in held:
        box = shard_box(shape, mesh, placements, mesh_coordinate(rank, mesh))
        if box != (tuple(piece.offsets), tuple(piece.shape)):
            raise _Unpredictable(
                f"tensor {tensor}: rank {rank}'s shard is not where {first.placement} on mesh"
                f" {list(mesh)} puts it"
            )
    return _Layout(shape, mesh, placements)


def _new_boxes(layout: _Layout, new_ranks: range, new_world: int) -> list[Box]:
    """The new ranks' shards of ``layout``: the same mesh, its outer dimension scaled."""
    mesh, placements = layout.mesh, layout.placements
    world = math.prod(mesh)
    if (mesh[0] * new_world) % world:
        raise _Unpredictable(
            f"mesh {list(mesh)}: its outer dimension does not scale to {new_world} ranks"
        )
    new_mesh = ((mesh[0] * new_world) // world, *mesh[1:])
    return [
        shard_box(layout.shape, new_mesh, placements, mesh_coordinate(rank, new_mesh))
        for rank in new_ranks
    ]


def _holders(
    layout: _Layout,
    boxes: Sequence[Box],
    own: int,
    own_ranks: set[int],
    part_of: dict[int, int],
) -> set[int]:
    """The parts holding the saved shards of ``layout`` that overlap ``boxes``; of copies of
    one shard (a replicated mesh dimension) the own part's, else the first rank's."""
    mesh, placements = layout.mesh, layout.placements

    def key(coordinate: Sequence[int | None]) -> tuple[int | None, ...]:
        return tuple(
            c if dim is not None else None for c, dim in zip(coordinate, placements, strict=True)
        )

    own_keys = {key(mesh_coordinate(rank, mesh)) for rank in own_ranks}
    parts: set[int] = set()
    for offsets, extent in boxes:
        for at in overlapping_coordinates(layout.shape, mesh, placements, offsets, extent):
            holder = own if at in own_keys else part_of.get(mesh_rank([c or 0 for c in at], mesh))
            if holder is None:
                raise _Unpredictable(f"mesh {list(mesh)}: a rank of no part")
            parts.add(holder)
    return parts
