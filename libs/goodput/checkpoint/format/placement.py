"""A DTensor's placements as a shard record writes them, and where they put each rank's shard.

One owner of that vocabulary: :func:`placement_text` is what the engine writes into
``ShardPiece.placement`` (torch's own short names, one per mesh dimension: ``S(0)`` for
``Shard(0)``, ``R`` for ``Replicate()``), :func:`parse_placements` reads it back. Anything else
(``_StridedShard``'s ``_S(0, 2)``, a ``Partial``, a name a later torch invents) parses to None:
its shards cannot be predicted, only read from the records.

:func:`shard_box` is torch's rule for those two placements, without torch (the replicator
plans with it and must not import torch): mesh dimensions in order, ``Shard(d)`` cuts the
current extent of tensor dimension ``d`` like ``torch.chunk`` (chunks of ``ceil(n / m)``, so
later coordinates may get a short or an EMPTY chunk, whose offset torch puts at the dimension's
end), ``Replicate()`` leaves it. Ranks lie on the mesh row-major in global-rank order (what
``init_device_mesh`` does by default).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Sequence

#: a placement the rule knows: the tensor dimension a mesh dimension shards, None: replicated
Placement = int | None
_KNOWN = re.compile(r"S\((\d+)\)|R")


def placement_text(placements: Iterable[object]) -> str:
    """What a shard record says of a DTensor's placements (torch's ``str`` of each)."""
    return ",".join(str(placement) for placement in placements)


def parse_placements(text: str, mesh: Sequence[int]) -> tuple[Placement, ...] | None:
    """The placements :func:`placement_text` wrote for a tensor on ``mesh``; None when one is
    not ``S(d)`` or ``R`` or they do not name one per mesh dimension."""
    parsed: list[Placement] = []
    for token in text.split(","):
        match = _KNOWN.fullmatch(token)
        if match is None:
            return None
        parsed.append(int(match.group(1)) if match.group(1) is not None else None)
    return tuple(parsed) if len(parsed) == len(mesh) and text else None


def mesh_coordinate(rank: int, mesh: Sequence[int]) -> tuple[int, ...]:
    """Where global rank ``rank`` lies on ``mesh`` (row-major)."""
    coordinate = []
    for size in reversed(mesh):
        rank, index = divmod(rank, size)
        coordinate.append(index)
    return tuple(reversed(coordinate))


def mesh_rank(coordinate: Sequence[int], mesh: Sequence[int]) -> int:
    """The global rank at ``coordinate`` of ``mesh`` (row-major)."""
    rank = 0
    for index, size in zip(coordinate, mesh, strict=True):
        rank = rank * size + index
    return rank


def _chunk(start: int, size: int, count: int, index: int) -> tuple[int, int]:
    """Chunk ``index`` of ``count`` of the extent ``[start, start + size)``, as torch.chunk cuts
    it: (start, size), size 0 for an empty chunk."""
    full = -(-size // count)
    lo = min(size, full * index)
    return start + lo, min(size, lo + full) - lo


def shard_box(
    shape: Sequence[int],
    mesh: Sequence[int],
    placements: Sequence[Placement],
    coordinate: Sequence[int],
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(global offsets, local shape) of the shard at ``coordinate`` of a tensor of ``shape``."""
    offsets, local = [0] * len(shape), list(shape)
    for dim, count, index in zip(placements, mesh, coordinate, strict=True):
        if dim is None:
            continue
        offsets[dim], local[dim] = _chunk(offsets[dim], local[dim], count, index)
        if not local[dim]:
            offsets[dim] = shape[dim]  # torch's offset of an empty shard
    return tuple(offsets), tuple(local)


def overlapping_coordinates(
    shape: Sequence[int],
    mesh: Sequence[int],
    placements: Sequence[Placement],
    offsets: Sequence[int],
    extent: Sequence[int],
) -> Iterator[tuple[int | None, ...]]:
    """The shards that share an element with the box ``offsets + extent``: their coordinates
    on the sharding mesh dimensions (None on a replicated one: every coordinate there holds
    the same shard). Visits only the chunks that overlap, so the cost follows the answer."""
    if not math.prod(extent):
        return

    def walk(
        mesh_dim: int, starts: tuple[int, ...], sizes: tuple[int, ...], at: tuple[int | None, ...]
    ) -> Iterator[tuple[int | None, ...]]:
        if mesh_dim == len(mesh):
            yield at
            return
        dim = placements[mesh_dim]
        if dim is None:
            yield from walk(mesh_dim + 1, starts, sizes, (*at, None))
            return
        count, start, size = mesh[mesh_dim], starts[dim], sizes[dim]
        full = -(-size // count)
        if not full:
            return
        first = max(0, (offsets[dim] - start) // full)
        last = min(count - 1, (offsets[dim] + extent[dim] - 1 - start) // full)
        for index in range(first, last + 1):
            lo, length = _chunk(start, size, count, index)
            if length and lo < offsets[dim] + extent[dim] and offsets[dim] < lo + length:
                yield from walk(
                    mesh_dim + 1,
                    (*starts[:dim], lo, *starts[dim + 1 :]),
                    (*sizes[:dim], length, *sizes[dim + 1 :]),
                    (*at, index),
                )

    yield from walk(0, (0,) * len(shape), tuple(shape), ())
