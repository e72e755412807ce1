"""A loss spike's batches skipped in the Hugging Face Trainer's own loop, from its callback.

A callback cannot keep the Trainer from running a batch: the forward and backward of a
skipped step (``TrainerShim.skips_data``, the step being ``global_step + 1``) run. What they
would change is dropped before it lands: just before the optimizer step (``on_pre_optimizer_step``,
after the Trainer clipped the gradients) every gradient is set to None, which a torch optimizer
takes as "no gradient" and steps nothing for (a zero gradient would still move AdamW's weights
by weight decay, and its moments), and the LR scheduler's ``step`` does nothing for this one
step. The step counts (``global_step``), so the Trainer's data position moves past the batch
as a run that skipped it from its start does.

What the forward changes besides the gradients stays, in both: the RNG draws of dropout and a
BatchNorm's running statistics (a model with BatchNorm takes in the skipped batch's). An
optimizer that steps parameters without a gradient, and fp16 training through a GradScaler
(whose step asserts that some gradient was unscaled), are not served.
"""

from __future__ import annotations

from typing import Any

import torch

from goodput.shim.trainer import TrainerShim


class SkippedSteps:
    """Drops the update of each step in a skip window; the callback calls it at the two
    points of the Trainer's step where that can be done."""

    def __init__(self, shim: TrainerShim) -> None:
        self.shim = shim
        #: the scheduler whose step is held for the step in hand (None: no step skipped)
        self._held: Any | None = None

    def before_optimizer_step(self, step: int, model: torch.nn.Module, scheduler: Any) -> None:
        """``step`` (the one the optimizer is about to take) skipped: no gradient reaches the
        optimizer, and the scheduler holds still."""
        if not self.shim.skips_data(step):
            return
        model.zero_grad(set_to_none=True)
        scheduler.step = _hold  # this instance's, until step_ended
        self._held = scheduler

    def step_ended(self) -> bool:
        """The step is over: True when it was skipped (the scheduler steps again from now)."""
        if self._held is None:
            return False
        del self._held.step
        self._held = None
        return True


def _hold(*_: Any, **__: Any) -> None:
    """A scheduler's ``step`` during a skipped step."""
