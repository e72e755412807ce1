"""Where goodput's own collectives put their tensors: on the device the group's backend serves.

A process group serves only the device types its backends were registered for: NCCL serves
CUDA tensors only, so a CPU tensor handed to an NCCL group is refused by torch's dispatch
("No backend type associated with device type cpu") before any byte moves; gloo serves both.
Every collective goodput issues outside the model's own data (the shim's votes and
agreements, barriers, the example's choice of a checkpoint) goes through this module, which
asks the group — through ``dist.get_backend_config``, the public form of what dispatch reads —
which device types it serves: CPU when it serves CPU (gloo, or a mixed "cpu:gloo,cuda:nccl"
group: the values start and end on the host), else the rank's current CUDA device (NCCL).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import ProcessGroup


def served_device_types(group: ProcessGroup | None = None) -> frozenset[str]:
    """The device types ``group`` (default: the default group) has a backend for.

    ``get_backend_config`` reads "cuda:nccl" for NCCL, "cpu:gloo,cuda:gloo" for gloo, and
    what was asked for a mixed group ("cpu:gloo,cuda:nccl") — the same map torch's dispatch
    uses to pick a backend for a tensor's device.
    """
    config = dist.get_backend_config(group)
    return frozenset(pair.split(":", 1)[0].strip() for pair in config.split(",") if ":" in pair)


def collective_device(group: ProcessGroup | None = None) -> torch.device:
    """The device for a small control collective on ``group``: the host where the group
    serves it, else (an NCCL-only group) the CUDA device the group was bound to with
    ``init_process_group(device_id=...)``, or this rank's current one."""
    served = served_device_types(group)
    if "cpu" in served:
        return torch.device("cpu")
    if "cuda" in served:
        bound = getattr(group or dist.group.WORLD, "bound_device_id", None)
        return bound if bound is not None else torch.device("cuda", torch.cuda.current_device())
    raise RuntimeError(
        f"goodput's collectives need a group serving cpu or cuda; this one serves "
        f"{', '.join(sorted(served)) or 'nothing'} ({dist.get_backend_config(group)})"
    )


def grouped(group: ProcessGroup | None = None) -> bool:
    """Whether this rank has peers in a process group to agree with."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1


def all_reduce_ints(
    values: list[int], op: dist.ReduceOp.RedOpType, group: ProcessGroup | None = None
) -> list[int]:
    """``op`` over every rank of ``group``, element-wise on ``values`` (64-bit integers)."""
    tensor = torch.tensor(values, dtype=torch.int64, device=collective_device(group))
    dist.all_reduce(tensor, op=op, group=group)
    return [int(v) for v in tensor.tolist()]


def barrier(group: ProcessGroup | None = None) -> None:
    """Wait for every rank of ``group``. On a group without a CPU backend (NCCL), the barrier
    runs on this rank's current device: without ``device_ids`` torch would guess one."""
    device = collective_device(group)
    if device.type == "cuda":
        dist.barrier(group=group, device_ids=[device.index])
    else:
        dist.barrier(group=group)


def broadcast_object(obj: Any, src: int = 0, group: ProcessGroup | None = None) -> Any:
    """``obj`` as rank ``src`` holds it, on every rank (pickled: small values only)."""
    box = [obj]
    dist.broadcast_object_list(box, src=src, group=group, device=collective_device(group))
    return box[0]


def all_gather_object(obj: Any, group: ProcessGroup | None = None) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank (pickled: small values only). torch
    stages the pickles on the device it picks for the group the same way (the host where the
    group serves it, else the current CUDA device, which ``run_job`` binds)."""
    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, obj, group=group)
    return gathered
