"""The torch-free placement rule (``format.placement``) against torch's own.

Every box comes from torch's ``_compute_local_shape_and_global_offset`` (what
``compute_local_shape_and_global_offset`` runs for a DTensor's rank), for uneven shapes,
tensors smaller than the mesh (empty shards), 1-D and 2-D meshes; the placement text is what
the engine writes for real torch placements.
"""

from __future__ import annotations

import itertools

import pytest
from torch.distributed.tensor import Partial, Replicate, Shard
from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset
from torch.distributed.tensor.placement_types import _StridedShard

from goodput.checkpoint.format.placement import (
    mesh_coordinate,
    mesh_rank,
    overlapping_coordinates,
    parse_placements,
    placement_text,
    shard_box,
)

MESHES = [
    ((1,), [Shard(0)]),
    ((3,), [Shard(0)]),
    ((4,), [Shard(1)]),
    ((5,), [Replicate()]),
    ((2, 3), [Replicate(), Shard(0)]),  # HSDP
    ((3, 2), [Shard(0), Shard(1)]),
    ((2, 4), [Shard(0), Shard(0)]),  # one dimension cut twice
    ((2, 2, 3), [Replicate(), Shard(1), Shard(0)]),
]
SHAPES = [(12, 4), (7, 3), (2, 5), (0, 3), (1, 1), (13, 9), (5, 2)]


def torch_box(shape, mesh, placements, coordinate) -> tuple[tuple[int, ...], tuple[int, ...]]:
    local, offsets = _compute_local_shape_and_global_offset(
        shape, mesh, list(coordinate), placements
    )
    return tuple(offsets), tuple(local)


@pytest.mark.parametrize(("mesh", "placements"), MESHES)
def test_the_rule_puts_every_shard_where_torch_does(mesh, placements) -> None:
    parsed = parse_placements(placement_text(placements), mesh)
    assert parsed is not None
    empty = 0
    for shape in SHAPES:
        for rank in range(len(list(itertools.product(*map(range, mesh))))):
            coordinate = mesh_coordinate(rank, mesh)
            assert mesh_rank(coordinate, mesh) == rank
            want = torch_box(shape, mesh, placements, coordinate)
            assert shard_box(shape, mesh, parsed, coordinate) == want, (shape, coordinate)
            empty += 0 in want[1] and 0 not in shape
    if mesh == (3,):
        assert empty  # (2, 5) over 3 ranks: the last shard is empty, placed at the end


@pytest.mark.parametrize(("mesh", "placements"), MESHES)
def test_overlapping_shards_are_exactly_the_ones_sharing_an_element(mesh, placements) -> None:
    parsed = parse_placements(placement_text(placements), mesh)
    coordinates = list(itertools.product(*map(range, mesh)))
    for shape, target in (((13, 9), ((3, 2), (6, 5))), ((7, 3), ((6, 0), (1, 3)))):
        want = set()
        for coordinate in coordinates:
            offsets, local = torch_box(shape, mesh, placements, coordinate)
            shares = all(
                max(o, t) < min(o + n, t + m)
                for o, n, t, m in zip(offsets, local, *target, strict=True)
            )
            if shares:
                want.add(
                    tuple(
                        c if d is not None else None
                        for c, d in zip(coordinate, parsed, strict=True)
                    )
                )
        assert set(overlapping_coordinates(shape, mesh, parsed, *target)) == want
    assert list(overlapping_coordinates((4, 4), mesh, parsed, (1, 1), (0, 2))) == []


def test_the_text_torch_writes_parses_and_nothing_else_does() -> None:
    assert placement_text([Replicate(), Shard(1)]) == "R,S(1)"
    assert parse_placements("R,S(1)", (2, 4)) == (None, 1)
    assert parse_placements("S(0)", (2, 4)) is None  # one per mesh dimension
    assert parse_placements("", ()) is None
    for unknown in ([_StridedShard(0, split_factor=2)], [Partial()], [Shard(0), Partial()]):
        assert parse_placements(placement_text(unknown), (2,) * len(unknown)) is None
    assert (
        parse_placements(placement_text([Shard(0), _StridedShard(0, split_factor=2)]), (2, 2))
        is None
    )
    assert parse_placements("Shard(dim=0)", (2,)) is None
