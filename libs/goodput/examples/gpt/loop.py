"""The training loop, written only against ``TrainingHooks`` so any supervisor can drive it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from goodput.examples.gpt.hooks import TrainingHooks
from goodput.examples.gpt.training import Trainer
from goodput.shim.step_protocol import end_step
from goodput.shim.stop_vote import StopVote


@dataclass
class LoopResult:
    first_step: int  # the step this process started from (after restore)
    step: int  # completed steps when the loop ended
    stopped: bool  # ended early on a stop request, before ``total_steps``
    losses: list[tuple[int, float]] = field(default_factory=list)  # (step, loss) run here
    step_time_s: float = 0.0  # total time spent in training steps here (no checkpoint, no startup)
    skipped: list[int] = field(default_factory=list)  # steps whose batch was skipped here


def run_training(
    trainer: Trainer, hooks: TrainingHooks, total_steps: int, stop_at: int | None = None
) -> LoopResult:
    """Restore, train to ``total_steps`` (or stop early), checkpoint as the hooks ask, finish.

    ``stop_at`` ends the run after that step as if a stop had been requested (save and exit).
    """
    restored = hooks.restore(trainer.state_dict(), plan=trainer.plan)
    if restored is not None:
        trainer.load_state_dict(restored.state, restored.plan)
    result = LoopResult(first_step=trainer.step, step=trainer.step, stopped=False)
    vote = StopVote()
    while trainer.step < total_steps:
        if stop_at is not None and trainer.step >= stop_at:
            result.stopped = True
            break
        if hooks.skips_data(trainer.step + 1):
            trainer.skip_step()
            result.skipped.append(trainer.step)
            continue
        started = time.perf_counter()
        loss = trainer.train_step(slowdown=hooks.compute_slowdown())
        step_time_s = time.perf_counter() - started
        result.step_time_s += step_time_s
        step = trainer.step
        result.step = step
        result.losses.append((step, loss))
        stop = end_step(
            hooks,
            step,
            step_time_s=step_time_s,
            tokens=trainer.tokens_per_step,
            loss=loss,
            state=trainer.state_dict,
            vote=vote,
            final=step >= total_steps,
            compute_time_s=trainer.last_compute_time_s,
        )
        if stop and step < total_steps:
            result.stopped = True
            break
    hooks.finish(trainer.state_dict(), trainer.step)
    return result
