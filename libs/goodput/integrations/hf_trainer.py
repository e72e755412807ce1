"""goodput for the Hugging Face ``Trainer`` (``pip install goodput[hf]``): a ``TrainerCallback``.

    goodput = GoodputTrainerCallback(plan=BatchPlan(global_batch=64, micro_batch=16, lr=1e-2))
    trainer = Trainer(model, TrainingArguments(save_strategy="no", ...), callbacks=[goodput], ...)
    trainer.train(resume_from_checkpoint=goodput.resume_path(trainer.args))
    sys.exit(goodput.exit_code)

After every optimizer step the callback reports the step (heartbeats go on in the shim's
thread), saves the Trainer's training state (model, optimizer, LR scheduler, the Trainer's
RNG states and its ``TrainerState``) through goodput's asynchronous engine when the ranks agree
it is due, and ends the training on SIGTERM or a stop command (a final save, then
``control.should_training_stop``; ``on_train_end`` waits until it is durable). The Trainer
resumes only from a checkpoint directory, so ``resume_path`` writes the newest checkpoint every
rank holds as one, in a temporary directory removed when training ends: the Trainer loads it
itself and skips the batches already trained (a bit-identical resume). The rescale callbacks
see the state under ``model``, ``optimizer`` and ``scheduler``: the built-in rules' defaults.
The steps of a loss spike's windows (``GOODPUT_SKIP_STEPS``) update nothing: no optimizer or
LR scheduler step (:mod:`goodput.integrations.hf_skip`, which says what they still change).
"""

from __future__ import annotations

import dataclasses
import json
import random
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.trainer import OPTIMIZER_NAME, SCHEDULER_NAME, TRAINER_STATE_NAME
from transformers.utils import WEIGHTS_NAME

from goodput.integrations.hf_skip import SkippedSteps
from goodput.shim.numerics import replicated
from goodput.shim.rescale import BatchPlan, RescaleCallback
from goodput.shim.restore_result import RestoreResult
from goodput.shim.step_protocol import end_step
from goodput.shim.stop_vote import StopVote
from goodput.shim.trainer import TrainerShim


class GoodputTrainerCallback(TrainerCallback):
    """Step reports, asynchronous checkpoints, restore, stop requests and rescale hooks."""

    def __init__(
        self,
        *,
        shim: TrainerShim | None = None,
        plan: BatchPlan | None = None,
        rescale: tuple[RescaleCallback, ...] | list[RescaleCallback] = (),
    ) -> None:
        self.shim = shim if shim is not None else TrainerShim.from_env()
        #: the batch plan in force: a restored checkpoint's (as the rescale callbacks left it)
        self.plan = plan
        for callback in rescale:
            self.shim.on_rescale(callback)
        #: what ``resume_path`` restored (None: a fresh start)
        self.restored: RestoreResult | None = None
        self._resumed = False
        self._resume_dir: Path | None = None
        self._started = 0.0
        self._vote = StopVote()
        self._skipped = SkippedSteps(self.shim)

    @property
    def exit_code(self) -> int:
        return self.shim.exit_code

    def resume_path(self, args: TrainingArguments | None = None) -> str | None:
        """The ``resume_from_checkpoint`` for ``trainer.train``: the newest checkpoint every
        rank holds (agreed over the default process group if one is up) written as a Trainer
        checkpoint directory, or None for a fresh start.

        Given the Trainer's ``args``, the batch plan in force sets their gradient accumulation
        (what ``keep_global_batch`` changes when the data-parallel size does); its
        ``micro_batch`` must then be ``per_device_train_batch_size``.
        """
        self.restored = self.shim.restore({}, plan=self.plan)
        self._resumed = True
        if self.restored is not None:
            self.plan = self.restored.plan
        if args is not None and self.plan is not None:
            if self.plan.micro_batch != args.per_device_train_batch_size:
                raise ValueError(
                    f"the batch plan's micro_batch ({self.plan.micro_batch}) is not "
                    f"per_device_train_batch_size ({args.per_device_train_batch_size})"
                )
            args.gradient_accumulation_steps = self.plan.accumulation_steps(
                self.shim.layout.dp_size
            )
        if self.restored is None:
            return None
        self._resume_dir = Path(tempfile.mkdtemp(prefix="goodput-resume-"))
        write_trainer_checkpoint(
            self.restored.state,
            self._resume_dir,
            self.shim.config.rank,
            self.shim.config.world_size,
        )
        return str(self._resume_dir)

    # ---- Trainer hooks ------------------------------------------------------------------------

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if not self._resumed:
            raise RuntimeError(
                "pass resume_from_checkpoint=callback.resume_path(trainer.args) to train()"
            )

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._started = time.perf_counter()

    def on_pre_optimizer_step(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._skipped.before_optimizer_step(
            state.global_step + 1, kwargs["model"], kwargs["lr_scheduler"]
        )

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self._skipped.step_ended():
            return  # a loss spike's batch, not trained on: nothing to report or save
        # the Trainer's logged loss and gradient norm (host values, every logging_steps)
        parameters = replicated(kwargs.get("model"))
        self.shim.numerics.observe(
            state.global_step, _last_loss(state), _last_logged(state, "grad_norm"), parameters
        )
        # the last step (max_steps seen by the Trainer's flow callback, or a stop) saves here,
        # before train() logs the summary of its call; on_train_end then only waits for it
        if end_step(
            self.shim,
            state.global_step,
            step_time_s=time.perf_counter() - self._started,
            tokens=0,
            loss=_last_loss(state),
            state=lambda: training_state(state, **kwargs),
            vote=self._vote,
            final=control.should_training_stop,
        ):
            control.should_training_stop = True

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self.shim.finish(training_state(state, **kwargs), state.global_step)
        if self._resume_dir is not None:
            shutil.rmtree(self._resume_dir, ignore_errors=True)
            self._resume_dir = None


def _last_loss(state: TrainerState) -> float:
    """The loss of the newest log entry (the Trainer logs every ``logging_steps``), or 0."""
    return _last_logged(state, "loss") or 0.0


def _last_logged(state: TrainerState, key: str) -> float | None:
    """``key`` of the newest log entry holding it, or None."""
    for entry in reversed(state.log_history):
        if key in entry:
            return float(entry[key])
    return None


def rng_states() -> dict[str, Any]:
    """The RNG states in the Trainer's own checkpoint format (``rng_state.pth``)."""
    states: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "cpu": torch.random.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.random.get_rng_state_all()
    return states


def training_state(
    state: TrainerState,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    lr_scheduler: Any,
    **_: Any,
) -> dict[str, Any]:
    """What a goodput checkpoint of a Trainer holds (what its own checkpoint directory does)."""
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": lr_scheduler.state_dict(),
        "rng": rng_states(),
        "trainer_state": json.loads(json.dumps(dataclasses.asdict(state))),  # a copy
    }


def write_trainer_checkpoint(
    saved: dict[str, Any], directory: Path, rank: int, world_size: int
) -> None:
    """``saved`` (a :func:`training_state`) as the checkpoint directory ``Trainer`` resumes
    from; the RNG file is this rank's, named as the Trainer looks for it."""
    torch.save(saved["model"], directory / WEIGHTS_NAME)
    torch.save(saved["optimizer"], directory / OPTIMIZER_NAME)
    torch.save(saved["scheduler"], directory / SCHEDULER_NAME)
    rng_file = f"rng_state_{rank}.pth" if world_size > 1 else "rng_state.pth"
    torch.save(saved["rng"], directory / rng_file)
    (directory / TRAINER_STATE_NAME).write_text(json.dumps(saved["trainer_state"]))
