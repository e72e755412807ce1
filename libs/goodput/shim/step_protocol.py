"""What every supervised loop does at the end of an optimizer step, written once: the plain
loop, the Lightning and Hugging Face callbacks, the shim's own loop (in-process restart) and
the example job all call :func:`end_step`.

1. report the step (the step event; the heartbeat thread carries the step number);
2. vote on stopping: every rank stops after the same step, or one would wait forever in the
   next collective for a peer that left. The vote is pipelined (:mod:`goodput.shim.stop_vote`):
   the ballot of step k is read at step k+1, so a stop is honoured one step after it was asked
   for, on every rank at the same step, and no step waits for the vote. Checkpoints are not
   voted: ``should_checkpoint`` answers the same on every rank by contract (the shim's
   schedule agrees on its changes at agreement steps, ``shim/schedule.py``);
3. the in-process restart hook: a Rejoin that arrived aborts the group under the vote, so an
   NCCL result is garbage then and the step unwinds (``RestartRequested``);
4. save when due, when stopping, and at the last step (before the framework logs its
   end-of-training summary; ``finish`` then only waits until it is durable).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from goodput.shim.stop_vote import StopVote


class RestartRequested(Exception):
    """Raised inside a step to unwind it: a Rejoin command arrived (``shim/inprocess.py``)."""


class StepHooks(Protocol):
    """The part of the example job's ``TrainingHooks`` (and of ``TrainerShim``) a step's end
    needs."""

    def step_done(
        self, step: int, step_time_s: float, tokens: int, loss: float, compute_time_s: float = 0.0
    ) -> None: ...

    def should_checkpoint(self, step: int) -> bool:
        """The same answer on every rank for the same step (it is not voted)."""
        ...

    def should_stop(self) -> bool: ...

    def save(self, state: dict[str, Any], step: int) -> None: ...


def end_step(
    hooks: StepHooks,
    step: int,
    *,
    step_time_s: float,
    tokens: int,
    loss: float,
    state: Callable[[], dict[str, Any]],
    vote: StopVote,
    final: bool = False,
    compute_time_s: float = 0.0,
    restart_pending: Callable[[], bool] | None = None,
) -> bool:
    """End completed step ``step``; True when the ranks agreed to stop after it. ``state``
    builds the training state only when it is saved; ``vote``: the loop's stop vote (one per
    loop, made again with its process group); ``final``: the loop ends after this step (its
    state is saved now); ``restart_pending``: whether a Rejoin waits (the shim's own loop
    only)."""
    hooks.step_done(step, step_time_s, tokens, loss, compute_time_s)
    checkpoint = hooks.should_checkpoint(step)
    stop = vote.cast(hooks.should_stop(), last=final)
    if restart_pending is not None and restart_pending():
        raise RestartRequested("a Rejoin command arrived")
    if checkpoint or stop or final:
        hooks.save(state(), step)
    return stop
