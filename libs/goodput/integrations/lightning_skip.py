"""A loss spike's batches skipped under Lightning's automatic optimization, its loop unforked.

Lightning runs every batch it draws through ``training_step``, the optimizer step and the
per-step LR schedulers. For a step in a skip window (``TrainerShim.skips_data``, the step being
``global_step + 1``) :func:`skip_windows` wraps those three hooks on the module instance:

- ``training_step`` returns a zero built from the parameters instead of running the user's:
  no forward on the batch (no dropout draw, no BatchNorm statistics), and the backward gives
  every parameter a zero gradient on every rank, so a data-parallel reduction still sees each
  one (Lightning's own skip, a ``training_step`` returning None, is refused with more than one
  process);
- ``optimizer_step`` runs the closure (Lightning requires it to have run) but not the
  optimizer: zero gradients would still move AdamW's weights by weight decay, and its moments;
- ``lr_scheduler_step`` leaves a per-step scheduler where it was.

The batch is drawn all the same, so the data position moves past it, and the step counts
(``global_step``), as in the shim's own loop: the run differs from one that skipped the window
from its start by nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl

from goodput.shim.trainer import TrainerShim

log = logging.getLogger(__name__)


def skip_windows(shim: TrainerShim, trainer: pl.Trainer, module: pl.LightningModule) -> bool:
    """Make ``module`` skip the steps of ``shim``'s windows; False (with one error line) where
    it cannot: a module that optimizes by hand runs its own steps."""
    if not module.automatic_optimization:
        log.error(
            "steps to skip, but the module optimizes manually: it trains on their batches "
            "(ask callback.shim.skips_data(trainer.global_step + 1) in training_step)"
        )
        return False
    training_step = module.training_step
    optimizer_step = module.optimizer_step
    scheduler_step = module.lr_scheduler_step

    def skipping() -> bool:
        return shim.skips_data(trainer.global_step + 1)

    def skipped_training_step(*args: Any, **kwargs: Any) -> Any:
        if not skipping():
            return training_step(*args, **kwargs)
        # one float on one device: parameters may differ in dtype, or sit on several devices
        trained = [p for p in module.parameters() if p.requires_grad]
        device = trained[0].device
        return sum(p.sum().float().to(device) * 0.0 for p in trained)

    def skipped_optimizer_step(
        epoch: int,
        batch_idx: int,
        optimizer: Any,
        optimizer_closure: Callable[[], Any] | None = None,
    ) -> None:
        if not skipping():
            optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
            return
        if optimizer_closure is not None:  # Lightning's automatic optimization passes one
            optimizer_closure()

    def skipped_scheduler_step(scheduler: Any, metric: Any) -> None:
        # called once the step counted: the step just done is global_step
        per_step = any(
            config.scheduler is scheduler and config.interval == "step"
            for config in trainer.lr_scheduler_configs
        )
        if per_step and shim.skips_data(trainer.global_step):
            return
        scheduler_step(scheduler, metric)

    module.training_step = skipped_training_step  # type: ignore[method-assign]  # Lightning's hook, wrapped on this instance on purpose
    module.optimizer_step = skipped_optimizer_step  # type: ignore[method-assign]  # Lightning's hook, wrapped on this instance on purpose
    module.lr_scheduler_step = skipped_scheduler_step  # type: ignore[method-assign]  # Lightning's hook, wrapped on this instance on purpose
    return True
