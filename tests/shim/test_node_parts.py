"""Which part of a sharded checkpoint a rank's shim saves into: its node's, when the job's
ranks span nodes; none (the node's root holds everything) otherwise."""

from __future__ import annotations

from goodput.shim import ShimConfig
from goodput.shim.config import node_parts


def test_ranks_spanning_nodes_save_their_nodes_part() -> None:
    config = ShimConfig(job="j", attempt=3, rank=5, world_size=6, local_rank=1, local_world_size=2)
    layout = node_parts(config)
    assert layout is not None
    assert (layout.part, layout.parts, layout.node_ranks) == (2, 3, [4, 5])
    assert not layout.leader and layout.namespace == "j/attempt-3"


def test_one_node_or_ranks_not_numbered_node_by_node_save_no_parts() -> None:
    assert node_parts(ShimConfig(rank=1, world_size=2, local_rank=1, local_world_size=2)) is None
    # rank 1 as local rank 0: not torchrun's numbering, so no layout (a spanning save fails)
    assert node_parts(ShimConfig(rank=1, world_size=4, local_rank=0, local_world_size=2)) is None
    assert node_parts(ShimConfig(rank=0, world_size=5, local_rank=0, local_world_size=2)) is None
