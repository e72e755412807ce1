"""How the ranks of a job agree: the same checkpoint to restore, the same steps to save and
stop at. Every rank must call these at the same point, or one waits forever for the others
in the collective; without a process group (one rank) they return their input. The tensors
go where the group's backend serves them (``shim/collectives.py``): CUDA under NCCL."""

from __future__ import annotations

import torch.distributed as dist

from goodput.shim.collectives import all_reduce_ints, grouped

__all__ = ["agree_min", "all_reduce_min", "any_rank", "grouped"]


def all_reduce_min(values: list[int]) -> list[int]:
    """Element-wise minimum of ``values`` over every rank of the default group."""
    return all_reduce_ints(values, dist.ReduceOp.MIN)


def agree_min(step: int | None) -> int | None:
    """The smallest of every rank's ``step`` (None on any rank: None); no-op without a group."""
    if not grouped():
        return step
    agreed = all_reduce_min([-1 if step is None else step])[0]
    return None if agreed < 0 else agreed


def any_rank(*flags: bool) -> list[bool]:
    """Each flag true if it is true on any rank, now (a blocking all-reduce: for agreements
    outside the step; a step's stop vote is pipelined, ``shim/stop_vote.py``)."""
    if not grouped():
        return list(flags)
    votes = all_reduce_ints([int(flag) for flag in flags], dist.ReduceOp.MAX)
    return [bool(vote) for vote in votes]
