"""``parts_needed``: which parts a node's new ranks read after a reshard, predicted and checked.

The own part's records are built from torch's boxes (``_compute_local_shape_and_global_offset``)
and the answer compared with a brute force over every old and new rank under torch's rule;
2,048 -> 2,047 nodes x 8 ranks is built with the format's rule (checked against torch in
``tests/ckpt/test_placement_rule.py``).
"""

from __future__ import annotations

import itertools

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

from goodput.checkpoint.format.parts import PartSummary
from goodput.checkpoint.format.parts_needed import parts_needed
from goodput.checkpoint.format.placement import (
    mesh_coordinate,
    parse_placements,
    placement_text,
    shard_box,
)
from goodput.checkpoint.format.sharded import SHARD_FORMAT, ShardPiece, ShardRecord

FSDP = [Shard(0)]
SHAPES = [(12, 4), (7, 3), (2, 5), (13,), (64, 8)]


def table(parts: int, per_part: int) -> list[PartSummary]:
    return [
        PartSummary(
            part=p, ranks=list(range(p * per_part, (p + 1) * per_part)), files_xxh3_128="", nbytes=0
        )
        for p in range(parts)
    ]


def torch_box(shape, mesh, placements, rank) -> tuple[tuple[int, ...], tuple[int, ...]]:
    local, offsets = _compute_local_shape_and_global_offset(
        shape, mesh, list(mesh_coordinate(rank, mesh)), placements
    )
    return tuple(offsets), tuple(local)


def records(ranks, shapes, mesh, placements, box=torch_box, text=None) -> list[ShardRecord]:
    """The own part's records: a shard of every tensor per rank, and a plain tensor (the
    node's first rank writes those), boxes by ``box``."""
    out = []
    for rank in ranks:
        pieces = [
            ShardPiece(
                tensor=t,
                offsets=list(box(shape, mesh, placements, rank)[0]),
                shape=list(box(shape, mesh, placements, rank)[1]),
                stream_offset=0,
                nbytes=0,
                blocks=[],
                placement=text or placement_text(placements),
                mesh=list(mesh),
            )
            for t, shape in enumerate(shapes)
        ]
        if rank == ranks[0]:
            pieces.append(
                ShardPiece(
                    tensor=len(shapes), offsets=[0], shape=[3], stream_offset=0, nbytes=0, blocks=[]
                )
            )
        out.append(
            ShardRecord(format=SHARD_FORMAT, rank=rank, world=0, block_bytes=1, pieces=pieces)
        )
    return out


def brute_force(parts, parts_new, per_part, place, shapes, mesh_of, placements) -> set[int]:
    """Every old part holding a shard that shares an element with node ``place``'s new
    shards (torch's boxes, every rank against every rank)."""
    old_mesh, new_mesh = mesh_of(parts * per_part), mesh_of(parts_new * per_part)
    needed = set()
    for shape in shapes:
        for new in range(place * per_part, (place + 1) * per_part):
            t_off, t_len = torch_box(shape, new_mesh, placements, new)
            for old in range(parts * per_part):
                o_off, o_len = torch_box(shape, old_mesh, placements, old)
                if all(
                    max(a, b) < min(a + n, b + m)
                    for a, n, b, m in zip(o_off, o_len, t_off, t_len, strict=True)
                ):
                    needed.add(old // per_part)
    return needed


def needed(parts, parts_new, per_part, own, place, shapes, mesh_of, placements=FSDP, **kw):
    mesh = mesh_of(parts * per_part)
    own_ranks = range(own * per_part, (own + 1) * per_part)
    return parts_needed(
        table(parts, per_part),
        own,
        records(list(own_ranks), shapes, mesh, placements, **kw),
        [*shapes, (3,)],
        place,
        parts_new,
    )


def test_fsdp_scale_down_up_and_by_two_read_only_the_overlapping_parts() -> None:
    def flat(world):
        return (world,)

    for parts, parts_new, per_part in ((3, 2, 2), (6, 4, 2), (2, 3, 2), (3, 2, 1), (5, 3, 4)):
        for place in range(parts_new):
            own = min(place, parts - 1)
            got = needed(parts, parts_new, per_part, own, place, SHAPES, flat)
            want = brute_force(parts, parts_new, per_part, place, SHAPES, flat, FSDP)
            assert got.parts == want, (parts, parts_new, place, got.reason)
    three_to_two = [needed(3, 2, 2, p, p, [(12, 4)], flat).parts for p in range(2)]
    assert three_to_two == [{0, 1}, {1, 2}]
    assert needed(3, 2, 2, 1, 0, [(12, 4)], flat).reason == "node 0 of 2 reads parts 0, 1 (2 of 3)"


def test_hsdp_reads_one_replica_the_own_one_when_it_holds_it() -> None:
    hsdp = [Replicate(), Shard(0)]

    def replica_per_node(world):  # HSDP: a replica per node of 2 ranks
        return (world // 2, 2)

    for place in range(3):
        got = needed(4, 3, 2, place, place, SHAPES, replica_per_node, hsdp)
        assert got.parts == {place}, got.reason  # its own replica holds every shard

    def replica_on_two_nodes(world):  # each replica spread over 2 nodes of 2 ranks
        return (world // 4, 4)

    # 4 -> 2 parts: node 1's new ranks hold replica shards 2, 3: in parts 1 and 3
    assert needed(4, 2, 2, 3, 1, SHAPES, replica_on_two_nodes, hsdp).parts == {3}
    assert needed(4, 2, 2, 0, 1, SHAPES, replica_on_two_nodes, hsdp).parts == {1}


def test_2048_to_2047_nodes_of_8_ranks_need_at_most_two_parts_per_tensor() -> None:
    parts, per_part = 2048, 8
    mesh = (parts * per_part,)
    # Llama-70B-like matrices leave the last ranks' shards empty (1 row of 8192 per rank)
    shapes = [(8192, 8192), (28672, 8192), (8192,), (128256, 8192), (5, 3), (1 << 20, 4)]
    rule = parse_placements("S(0)", mesh)

    def by_rule(shape, mesh, _placements, rank):
        return shard_box(shape, mesh, rule, mesh_coordinate(rank, mesh))

    def of(place: int, tensors: list[tuple[int, ...]]) -> frozenset[int]:
        own = range(place * per_part, (place + 1) * per_part)
        got = parts_needed(
            table(parts, per_part),
            place,
            records(list(own), tensors, mesh, FSDP, by_rule),
            [*tensors, (3,)],
            place,
            parts - 1,
        )
        assert got.parts is not None, got.reason
        return got.parts

    for place in (0, 1, 777, 1500, 2045, 2046):
        each = [of(place, [shape]) for shape in shapes]
        for one in each:  # each tensor: the parts of a contiguous range of old ranks
            assert len(one) <= 2 and (not one or max(one) - min(one) <= 1)
        assert of(place, shapes) == frozenset().union(*each)
    # chunks of ceil(rows / ranks) shift by tensor: node 777 reads its own part for most
    # and parts 789, 790 for the 2**20-row one
    assert of(777, shapes) == {777, 789, 790}


def test_what_it_cannot_predict_it_says_and_stages_everything() -> None:
    def flat(world):
        return (world,)

    strided = needed(3, 2, 2, 0, 0, [(12, 4)], flat, text="_S(0, 2)")
    assert strided.parts is None and "'_S(0, 2)' is not predictable" in strided.reason

    def shifted(shape, mesh, placements, rank):  # a record the rule disagrees with
        offsets, local = torch_box(shape, mesh, placements, rank)
        return (offsets[0] + 1, *offsets[1:]) if rank == 1 else offsets, local

    wrong = needed(3, 2, 2, 0, 0, [(12, 4)], flat, box=shifted)
    assert wrong.parts is None and "rank 1's shard is not where S(0) on mesh [6]" in wrong.reason

    def two_d(world):  # outer dimension 2 of 6 ranks: 4 ranks make 4/3 of it
        return (2, world // 2)

    odd = needed(3, 2, 2, 0, 0, [(12, 4)], two_d, placements=[Shard(0), Shard(1)])
    assert odd.parts is None and "does not scale to 4 ranks" in odd.reason

    uneven = [*table(2, 2), PartSummary(part=2, ranks=[4], files_xxh3_128="", nbytes=0)]
    mesh = (5,)
    got = parts_needed(uneven, 0, records([0, 1], [(10,)], mesh, FSDP), [(10,), (3,)], 0, 2)
    assert got.parts is None and "unequal numbers of ranks" in got.reason

    other_mesh = needed(3, 2, 2, 0, 0, [(12, 4)], lambda world: (world + 1,))
    assert other_mesh.parts is None and "is not the commit's 6 ranks" in other_mesh.reason
    # a tensor the own part holds no shard of (a mesh without its ranks)
    own = records([0, 1], [(12, 4)], (6,), FSDP)
    missing = parts_needed(table(3, 2), 0, own, [(12, 4), (3,), (9,)], 0, 2)
    assert missing.parts is None and "tensor 2: no shard" in missing.reason
    assert len(list(itertools.chain(own[0].pieces, own[1].pieces))) == 3
