"""goodput for PyTorch Lightning (``pip install goodput[lightning]``): a ``Callback``.

    goodput = GoodputCallback(plan=BatchPlan(global_batch=64, lr=1e-2))
    trainer = L.Trainer(callbacks=[goodput], plugins=[goodput.checkpoint_io], ...)
    trainer.fit(model, data, ckpt_path=goodput.resume_path())
    sys.exit(goodput.exit_code)

After every optimizer step the callback reports the step (heartbeats go on in the shim's
thread), saves Lightning's full checkpoint (model, optimizers, LR schedulers, loops, callbacks
and the RNG states this callback adds) through goodput's asynchronous engine when the ranks
agree it is due, and stops the fit on SIGTERM or a stop command (saving first). On start,
``resume_path`` names the newest checkpoint every rank holds, which Lightning loads through
``checkpoint_io``; when the data-parallel size changed the rescale callbacks see Lightning's
checkpoint dict (use :data:`LIGHTNING_KEYS` for the built-in LR rules).
"""

from __future__ import annotations

import time
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.plugins.io import CheckpointIO

from goodput.integrations.loop import rng_states, set_rng_states
from goodput.shim.agree import any_rank
from goodput.shim.rescale import BatchPlan, RescaleCallback
from goodput.shim.restore_result import RestoreResult
from goodput.shim.trainer import TrainerShim

#: where a Lightning checkpoint keeps the (first) optimizer's and LR scheduler's state dicts,
#: for ``scale_lr(..., **LIGHTNING_KEYS)`` and ``adjust_schedule(scheduler_key=...)``
LIGHTNING_KEYS = {"optimizer_key": "optimizer_states.0", "scheduler_key": "lr_schedulers.0"}

#: the ``ckpt_path`` that tells Lightning to load through :class:`GoodputCheckpointIO`
RESUME_PATH = "goodput://newest"


class GoodputCheckpointIO(CheckpointIO):
    """Loads Lightning's checkpoint from goodput's engine (saves go through the callback)."""

    def __init__(self, callback: GoodputCallback) -> None:
        self.callback = callback

    def load_checkpoint(
        self, path: Any, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        restored = self.callback.restored
        if str(path) != RESUME_PATH or restored is None:
            raise ValueError(f"{path}: goodput loads only {RESUME_PATH} (from resume_path())")
        return restored.state

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        raise ValueError(
            "goodput saves Lightning checkpoints itself: turn off enable_checkpointing and "
            "trainer.save_checkpoint, or give this plugin only to the goodput-supervised trainer"
        )

    def remove_checkpoint(self, path: Any) -> None:
        """Retention is the engine's (``keep_last``)."""


class GoodputCallback(pl.Callback):
    """Step reports, asynchronous checkpoints, restore, stop requests and rescale hooks."""

    def __init__(
        self,
        *,
        shim: TrainerShim | None = None,
        plan: BatchPlan | None = None,
        rescale: tuple[RescaleCallback, ...] | list[RescaleCallback] = (),
    ) -> None:
        self.shim = shim if shim is not None else TrainerShim.from_env()
        self.plan = plan
        for callback in rescale:
            self.shim.on_rescale(callback)
        self.checkpoint_io = GoodputCheckpointIO(self)
        #: what ``resume_path`` restored (None: a fresh start)
        self.restored: RestoreResult | None = None
        self._resumed = False
        self._started = 0.0

    @property
    def exit_code(self) -> int:
        return self.shim.exit_code

    def resume_path(self) -> str | None:
        """The ``ckpt_path`` for ``trainer.fit``: the newest checkpoint every rank holds
        (agreed over the default process group if one is up), or None for a fresh start."""
        self.restored = self.shim.restore({}, plan=self.plan)
        self._resumed = True
        if self.restored is None:
            return None
        self.plan = self.restored.plan
        return RESUME_PATH

    # ---- Lightning hooks ----------------------------------------------------------------------

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._started = time.perf_counter()

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._resumed:
            raise RuntimeError("pass ckpt_path=callback.resume_path() to trainer.fit")

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        step = trainer.global_step
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.shim.step_done(
            step,
            time.perf_counter() - self._started,
            tokens=0,
            loss=float(loss) if loss is not None else 0.0,
        )
        checkpoint, stop = any_rank(self.shim.should_checkpoint(step), self.shim.should_stop())
        if stop:
            trainer.should_stop = True  # on_train_end saves
        elif checkpoint:
            self.shim.save(self._checkpoint(trainer), step)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.shim.finish(self._checkpoint(trainer), trainer.global_step)

    def state_dict(self) -> dict[str, Any]:
        """Saved in Lightning's checkpoint: the RNG states, so dropout and shuffling resume
        where they were."""
        return {"rng": rng_states()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_rng_states(state_dict["rng"])

    @staticmethod
    def _checkpoint(trainer: pl.Trainer) -> dict[str, Any]:
        # what trainer.save_checkpoint writes, taken on every rank (each node keeps its copy)
        return trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
