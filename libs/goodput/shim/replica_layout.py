"""Which ranks hold the same shard of a sharded (DTensor) model, so that their fingerprints
can be compared as replicas (``goodput.shim.numerics``).

Under FSDP2 alone (a 1-D mesh, ``Shard``) every rank's shard is its own: nothing to compare.
Under HSDP (a 2-D mesh: ``Replicate`` over its first dimension, ``Shard`` over its second)
the ranks of one column of the mesh hold the same shard after each optimizer step, replicas
exactly as DDP's ranks are. The numerics monitor compares ranks ``slot, slot + S, …`` (one
slot per shard, S the shard dimension's size), which are a column when the mesh lists the
ranks row by row, as ``init_device_mesh`` does; any other layout (another order, several
meshes, a mesh without a replicate dimension) is left out, as every DTensor was before.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from goodput.checkpoint.engine.sharded_save import is_dtensor


def hsdp_slots(parameters: Sequence[torch.Tensor], world: int) -> int | None:
    """The number of shards when ``parameters``' DTensors are HSDP replicas the monitor can
    compare slot by slot (``rank % slots``); None when there are none to compare."""
    sharded = [p for p in parameters if is_dtensor(p)]
    if not sharded:
        return None
    mesh = sharded[0].device_mesh
    if mesh.ndim != 2 or mesh.size(0) < 2:
        return None
    for parameter in sharded:
        placements = parameter.placements
        if parameter.device_mesh is not mesh or not placements[0].is_replicate():
            return None
    if mesh.mesh.flatten().tolist() != list(range(world)):
        return None
    return int(mesh.size(1))
