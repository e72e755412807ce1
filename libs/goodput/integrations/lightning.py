"""goodput for PyTorch Lightning (``pip install goodput[lightning]``): a ``Callback``.

    loader = DataLoader(dataset, batch_size=16, sampler=ResumableSampler(len(dataset)))
    goodput = GoodputCallback(plan=BatchPlan(global_batch=64, micro_batch=16, lr=1e-2),
                              data=loader)
    trainer = L.Trainer(callbacks=[goodput], plugins=[goodput.checkpoint_io],
                        use_distributed_sampler=False, ...)
    trainer.fit(model, data, ckpt_path=goodput.resume_path())
    sys.exit(goodput.exit_code)

After every optimizer step the callback reports the step (heartbeats go on in the shim's
thread), saves Lightning's full checkpoint (model, optimizers, LR schedulers, loops, callbacks
and the RNG states this callback adds) through goodput's asynchronous engine when the ranks
agree it is due, and stops the fit on SIGTERM or a stop command (saving first). On start,
``resume_path`` names the newest checkpoint every rank holds, which Lightning loads through
``checkpoint_io``; when the data-parallel size changed the rescale callbacks see Lightning's
checkpoint dict (use :data:`LIGHTNING_KEYS` for the built-in LR rules).

Given the training loader (``data=``), the callback saves where its data stream stands with
the checkpoint (:mod:`goodput.shim.data_position`): Lightning restarts a plain loader's epoch
at batch 0, the sampler goes on with the next unseen batch. The batch plan is applied on every
resume: Lightning's ``accumulate_grad_batches`` is the plan's accumulation at the
data-parallel size in force (what ``keep_global_batch`` changes), the loader's batch size must
be the plan's ``micro_batch``. The steps of a loss spike's windows (``GOODPUT_SKIP_STEPS``)
draw their batches and train on none of them (:mod:`goodput.integrations.lightning_skip`).
"""

from __future__ import annotations

import time
from typing import Any

import lightning
import lightning.pytorch as pl
from lightning.pytorch.plugins.io import CheckpointIO

from goodput.integrations.lightning_skip import skip_windows
from goodput.integrations.loop import rng_states, set_rng_states
from goodput.shim.data_position import DataPositionError, LoaderPosition, resumable_sampler
from goodput.shim.numerics import replicated
from goodput.shim.rescale import BatchPlan, RescaleCallback
from goodput.shim.restore_result import RestoreResult
from goodput.shim.step_protocol import end_step
from goodput.shim.stop_vote import StopVote
from goodput.shim.trainer import TrainerShim

#: where a Lightning checkpoint keeps the (first) optimizer's and LR scheduler's state dicts,
#: for ``scale_lr(..., **LIGHTNING_KEYS)`` and ``adjust_schedule(scheduler_key=...)``
LIGHTNING_KEYS = {"optimizer_key": "optimizer_states.0", "scheduler_key": "lr_schedulers.0"}

#: the Lightning versions whose private ``Trainer._checkpoint_connector.dump_checkpoint``
#: (see ``GoodputCallback._checkpoint``) this module was read against
CHECKED_MAJOR = "2"

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
        data: Any | None = None,
    ) -> None:
        if lightning.__version__.split(".")[0] != CHECKED_MAJOR:
            raise RuntimeError(
                f"goodput's Lightning callback supports Lightning {CHECKED_MAJOR}.x, "
                f"not {lightning.__version__}"
            )
        self.shim = shim if shim is not None else TrainerShim.from_env()
        self.plan = plan
        for callback in rescale:
            self.shim.on_rescale(callback)
        self.checkpoint_io = GoodputCheckpointIO(self)
        #: the training loader's position (None: the script gave no loader)
        self.data = LoaderPosition(data) if data is not None else None
        #: what ``resume_path`` restored (None: a fresh start)
        self.restored: RestoreResult | None = None
        self._resumed = False
        self._started = 0.0
        self._reported_step = -1
        self._restored_rng: dict[str, Any] | None = None
        self._finished = False
        self._vote = StopVote()
        #: the module skips the steps of the shim's windows (``lightning_skip``)
        self._skipping = False

    @property
    def exit_code(self) -> int:
        return self.shim.exit_code

    def resume_path(self) -> str | None:
        """The ``ckpt_path`` for ``trainer.fit``: the newest checkpoint every rank holds
        (agreed over the default process group if one is up), or None for a fresh start."""
        self.restored = self.shim.restore({}, plan=self.plan)
        self._resumed = True
        if self.restored is not None:
            self.plan = self.restored.plan
        if self.data is not None:
            self.data.bind(self.shim, self.plan)
        return None if self.restored is None else RESUME_PATH

    @property
    def accumulation_steps(self) -> int:
        """Batches per optimizer step on this rank: the plan's at this data-parallel size."""
        return 1 if self.plan is None else self.plan.accumulation_steps(self.shim.layout.dp_size)

    # ---- Lightning hooks ----------------------------------------------------------------------

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._started = time.perf_counter()

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._resumed:
            raise RuntimeError("pass ckpt_path=callback.resume_path() to trainer.fit")
        if self.plan is not None:
            # the plan's accumulation replaces the Trainer's: on every resume, as the rescale
            # callbacks left the plan (a fresh start with another value is a contradiction)
            accumulation = self.accumulation_steps
            if self.restored is None and trainer.accumulate_grad_batches not in (1, accumulation):
                raise ValueError(
                    f"accumulate_grad_batches={trainer.accumulate_grad_batches} but the batch "
                    f"plan runs {accumulation} accumulation steps: leave it to the plan"
                )
            trainer.accumulate_grad_batches = accumulation
        # a loss spike's batches: drawn, not trained on (a manual optimization trains on)
        self._skipping = bool(self.shim.config.skip_steps) and skip_windows(
            self.shim, trainer, pl_module
        )

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # the loops are restored by now (on_fit_start comes before them): the resumed step
        self._reported_step = trainer.global_step
        if self._restored_rng is not None:
            set_rng_states(self._restored_rng)
            self._restored_rng = None
        if self.data is None:
            return
        sampler = resumable_sampler(self.data.loader)
        if sampler is not None and resumable_sampler(trainer.train_dataloader) is not sampler:
            raise DataPositionError(
                "Lightning replaced the loader's ResumableSampler: pass "
                "use_distributed_sampler=False to the Trainer (the sampler shards itself)"
            )

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if self.data is not None and self.plan is not None:
            self.data.advance(self.plan.micro_batch * self.shim.layout.dp_size)
        step = trainer.global_step
        if step == self._reported_step:
            return  # a micro-batch of an accumulation: no optimizer step, no step to report
        self._reported_step = step
        if self._skipping and self.shim.skips_data(step):
            return  # its batches drawn, not trained on: nothing to report or save
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        # on the device until the window's end (goodput.shim.numerics): no sync per step
        parameters = replicated(pl_module)
        self.shim.numerics.observe(step, 0.0 if loss is None else loss, None, parameters)
        if end_step(
            self.shim,
            step,
            step_time_s=time.perf_counter() - self._started,
            tokens=0,
            loss=self.shim.numerics.last_loss,
            state=lambda: self._checkpoint(trainer),
            vote=self._vote,
        ):
            trainer.should_stop = True

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._finish(trainer)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # a job resumed at its last step trains nothing: Lightning skips the fit loop and its
        # train hooks, and only this one tells the shim the job is done (its final state is
        # the restored checkpoint: nothing is saved again)
        self._finish(trainer)

    def _finish(self, trainer: pl.Trainer) -> None:
        if not self._finished:
            self._finished = True
            self.shim.finish(self._checkpoint(trainer), trainer.global_step)

    def state_dict(self) -> dict[str, Any]:
        """Saved in Lightning's checkpoint: the RNG states, so dropout and shuffling resume
        where they were, and the data loader's position."""
        state: dict[str, Any] = {"rng": rng_states()}
        if self.data is not None:
            state["data"] = self.data.state()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # applied in on_train_start: Lightning starts the loader's pass (a DataLoader draws its
        # workers' seed from the global RNG) after loading the checkpoint, where the
        # uninterrupted run started none
        self._restored_rng = state_dict["rng"]
        if self.data is not None:
            if "data" not in state_dict:
                raise DataPositionError("the checkpoint holds no data position to resume from")
            self.data.load(state_dict["data"])

    @staticmethod
    def _checkpoint(trainer: pl.Trainer) -> dict[str, Any]:
        """What ``trainer.save_checkpoint`` writes, taken on every rank. The public route
        (``save_checkpoint`` through a CheckpointIO) hands the dict to global rank 0 only and
        every node must keep its own copy, so this calls the connector that builds it: a
        private API, checked against the Lightning versions it was read in."""
        return trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
