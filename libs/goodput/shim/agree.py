"""How the ranks of a job agree: the same checkpoint to restore, the same steps to save and
stop at. Every rank must call these at the same point, or one waits forever for the others
in the collective; without a process group (one rank) they return their input."""

from __future__ import annotations

import torch
import torch.distributed as dist


def grouped() -> bool:
    """Whether this rank has peers in a process group to agree with."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def all_reduce_min(values: list[int]) -> list[int]:
    """Element-wise minimum of ``values`` over every rank of the default group."""
    device = (
        torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    )
    tensor = torch.tensor(values, dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return [int(v) for v in tensor.tolist()]


def agree_min(step: int | None) -> int | None:
    """The smallest of every rank's ``step`` (None on any rank: None); no-op without a group."""
    if not grouped():
        return step
    agreed = all_reduce_min([-1 if step is None else step])[0]
    return None if agreed < 0 else agreed


def any_rank(*flags: bool) -> list[bool]:
    """Each flag true if it is true on any rank: the ranks must checkpoint and stop together,
    or one would wait forever in the next collective for a peer that left."""
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return list(flags)
    votes = torch.tensor([int(flag) for flag in flags], dtype=torch.int32)
    dist.all_reduce(votes, op=dist.ReduceOp.MAX)
    return [bool(vote) for vote in votes.tolist()]
