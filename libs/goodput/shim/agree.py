"""How the ranks of a job agree: the same checkpoint to restore, the same steps to save and
stop at. Every rank must call these at the same point, or one waits forever for the others
in the collective; without a process group (one rank) they return their input. The tensors
go where the group's backend serves them (``shim/collectives.py``): CUDA under NCCL."""

from __future__ import annotations

import torch.distributed as dist

from goodput.shim.collectives import all_reduce_ints, grouped

__all__ = ["agree_range", "all_reduce_min", "any_rank", "grouped"]


def all_reduce_min(values: list[int]) -> list[int]:
    """Element-wise minimum of ``values`` over every rank of the default group."""
    return all_reduce_ints(values, dist.ReduceOp.MIN)


def agree_range(step: int | None) -> tuple[int | None, int | None]:
    """The smallest and largest of every rank's ``step`` in one all-reduce (None counts as
    below every step: the smallest is None when any rank has none, the largest only when all
    have none). Equal ends mean every rank holds the same step; no-op without a group."""
    if not grouped():
        return step, step
    own = -1 if step is None else step
    low, neg_high = all_reduce_min([own, -own])
    return (None if low < 0 else low), (None if -neg_high < 0 else -neg_high)


def any_rank(*flags: bool) -> list[bool]:
    """Each flag true if it is true on any rank, now (a blocking all-reduce: for agreements
    outside the step; a step's stop vote is pipelined, ``shim/stop_vote.py``)."""
    if not grouped():
        return list(flags)
    votes = all_reduce_ints([int(flag) for flag in flags], dist.ReduceOp.MAX)
    return [bool(vote) for vote in votes]
