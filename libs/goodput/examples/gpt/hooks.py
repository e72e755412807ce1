"""What the training loop needs from its surroundings: checkpoint storage, stop requests, metrics.

``LocalFileHooks`` implements it with files for standalone runs and tests; the goodput trainer
shim implements it with the async checkpoint engine and the bus.
"""

from __future__ import annotations

from typing import Any, Protocol

from goodput.shim.rescale import BatchPlan, RescaleCallback
from goodput.shim.restore_result import RestoreResult


class TrainingHooks(Protocol):
    def on_rescale(self, callback: RescaleCallback) -> RescaleCallback:
        """Run ``callback`` at restore when the data-parallel size differs from the saved one."""
        ...

    def restore(
        self, template_state: dict[str, Any], plan: BatchPlan | None = None
    ) -> RestoreResult | None:
        """The newest usable checkpoint, or None to start from scratch.

        ``template_state`` has the structure (and the live tensors) of the state to restore;
        ``plan`` is the batch plan of a fresh start. Every rank must get the same checkpoint,
        rescaled by the registered callbacks when the data-parallel size changed.
        """
        ...

    def step_done(
        self, step: int, step_time_s: float, tokens: int, loss: float, compute_time_s: float = 0.0
    ) -> None:
        """Called after each optimizer step; ``step`` counts completed steps.

        ``compute_time_s`` is this rank's own compute, without waiting for peers (who is slow).
        """
        ...

    def skips_data(self, step: int) -> bool:
        """Whether the loop skips the batch of ``step`` (the loss spike's window of a numerical
        rollback): it advances past the batch without training on it."""
        ...

    def compute_slowdown(self) -> float:
        """How many times as long this rank's next step should compute: 1.0, or more while a
        straggler is injected for chaos testing (a slow device, seen from the host)."""
        ...

    def should_checkpoint(self, step: int) -> bool:
        """Whether to save after completed step ``step`` (the loop makes the ranks agree)."""
        ...

    def save(self, state: dict[str, Any], step: int) -> None:
        """Start saving ``state``; may finish in the background but must not block long.

        ``state`` holds live tensors that training mutates next step: snapshot before returning.
        """
        ...

    def should_stop(self) -> bool:
        """A stop was asked for (SIGTERM, a stop command): the loop saves and exits."""
        ...

    def finish(self, state: dict[str, Any], step: int) -> None:
        """Final save of ``state`` at ``step`` (if not saved yet) and flush of pending writes."""
        ...
