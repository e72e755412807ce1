"""GoodputCallback in this process with a real Lightning Trainer (no bus): a job that crashes
after a mid-epoch checkpoint resumes on the next unseen batch and ends bit-identical to the
uninterrupted run; after 2 -> 1 data-parallel ranks under ``keep_global_batch`` it runs the
plan's 2 accumulation steps over the same global batches; ``scale_lr`` needs no scheduler."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from goodput import schemas
from goodput.shim import BatchPlan, ShimConfig, TrainerShim, keep_global_batch, scale_lr
from goodput.shim.data_position import DataPositionError, ResumableSampler
from goodput.shim.rescale import RescaleCallback
from tests.examples.launch import free_port
from tests.integrations.extras import require
from tests.integrations.harness import REPO, SAMPLES, Indexed, assert_identical

L = require("lightning")

from goodput.integrations.lightning import LIGHTNING_KEYS, GoodputCallback  # noqa: E402

PLAN = BatchPlan(global_batch=8, micro_batch=4, lr=1e-2)


class Crash(RuntimeError):
    """The simulated loss of the process after a checkpoint."""


class Regression(L.LightningModule):
    def __init__(self, scheduler: bool = True, interval: str = "epoch") -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1)
        )
        self.scheduler, self.interval = scheduler, interval
        #: the sample indices of each optimizer step, in order
        self.seen: list[list[int]] = []
        self._batch: list[int] = []

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        index, features = batch
        self._batch += index.tolist()
        return self.net(features).square().mean()

    def on_before_optimizer_step(self, optimizer: Any) -> None:
        self.seen.append(self._batch)
        self._batch = []

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.AdamW(self.parameters(), lr=PLAN.lr)
        if not self.scheduler:
            return optimizer
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
        return [optimizer], [{"scheduler": scheduler, "interval": self.interval}]


class CrashAfter(L.Callback):
    """Raises at the first batch after optimizer step ``step`` (once its checkpoint is durable)."""

    def __init__(self, goodput: GoodputCallback, step: int) -> None:
        self.goodput, self.step = goodput, step

    def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
        if trainer.global_step == self.step:
            self.goodput.shim.engine.wait_until_idle()
            raise Crash


class StopAt(L.Callback):
    """Sends the shim a stop command during step ``step`` (as the supervisor would)."""

    def __init__(self, goodput: GoodputCallback, step: int) -> None:
        self.goodput, self.step = goodput, step

    def on_train_batch_start(self, trainer: Any, *args: Any) -> None:
        if trainer.global_step == self.step - 1:
            self.goodput.shim._on_command(schemas.Stop(job="j", reason="test"))


def train(
    directory: Path,
    *,
    ckpt_every: int = 4,
    crash_after: int | None = None,
    stop_at: int | None = None,
    world_size: int = 1,
    rescale: list[RescaleCallback] | None = None,
    scheduler: bool = True,
    batch_size: int = PLAN.micro_batch,
    skip: tuple[schemas.StepWindow, ...] = (),
    restore_before: int | None = None,
    interval: str = "epoch",
    module_type: type[Regression] | None = None,
) -> tuple[GoodputCallback, Any, Regression]:
    torch.manual_seed(0)
    config = ShimConfig(
        ckpt_dir=str(directory),
        ckpt_every=ckpt_every,
        world_size=world_size,
        skip_steps=skip,
        restore_before_step=restore_before,
    )
    shim = TrainerShim(config, install_signal_handlers=False)
    loader = torch.utils.data.DataLoader(
        Indexed(), batch_size=batch_size, sampler=ResumableSampler(SAMPLES, seed=3)
    )
    reported = shim.reported = []  # type: ignore[attr-defined]
    step_done = shim.step_done
    shim.step_done = lambda step, *a, **k: (reported.append(step), step_done(step, *a, **k))  # type: ignore[method-assign]
    finished = shim.finished = []  # type: ignore[attr-defined]
    finish = shim.finish
    shim.finish = lambda state, step: (finished.append(step), finish(state, step))  # type: ignore[method-assign]
    goodput = GoodputCallback(
        shim=shim, plan=PLAN, rescale=rescale or [keep_global_batch], data=loader
    )
    callbacks: list[Any] = [goodput]
    if crash_after is not None:
        callbacks.append(CrashAfter(goodput, crash_after))
    if stop_at is not None:
        callbacks.append(StopAt(goodput, stop_at))
    trainer = L.Trainer(
        max_steps=12,
        accelerator="cpu",
        callbacks=callbacks,
        plugins=[goodput.checkpoint_io],
        use_distributed_sampler=False,
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    module = (module_type or Regression)(scheduler, interval)
    try:
        trainer.fit(module, loader, ckpt_path=goodput.resume_path())
    except Crash:
        shim.engine.close()
    return goodput, trainer, module


def weights(trainer: Any) -> dict[str, Any]:
    state = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
    return {key: state[key] for key in ("state_dict", "optimizer_states", "lr_schedulers")}


@pytest.mark.parametrize("ckpt_every", [3, 4, 7])
def test_a_crash_after_a_mid_epoch_checkpoint_resumes_bit_identically(
    tmp_path: Path, ckpt_every: int
) -> None:
    _, reference, reference_module = train(tmp_path / "reference", ckpt_every=ckpt_every)
    train(tmp_path / "resumed", ckpt_every=ckpt_every, crash_after=ckpt_every)
    goodput, resumed, module = train(tmp_path / "resumed", ckpt_every=ckpt_every)
    assert goodput.restored is not None and goodput.restored.step == ckpt_every
    assert resumed.global_step == reference.global_step == 12
    assert module.seen == reference_module.seen[ckpt_every:]  # the next unseen batches
    assert_identical(weights(resumed), weights(reference))


def test_a_stop_command_mid_epoch_saves_and_resumes_bit_identically(tmp_path: Path) -> None:
    _, reference, reference_module = train(tmp_path / "reference", ckpt_every=50)
    stopped, first, _ = train(tmp_path / "resumed", ckpt_every=50, stop_at=3)
    assert first.global_step == 3 and stopped.shim.should_stop()
    goodput, resumed, module = train(tmp_path / "resumed", ckpt_every=50)
    assert goodput.restored is not None and goodput.restored.step == 3
    assert module.seen == reference_module.seen[3:]
    assert_identical(weights(resumed), weights(reference))


WINDOW = schemas.StepWindow(5, 6)


def test_a_spike_window_rolled_back_and_skipped_ends_as_a_run_that_skipped_it(
    tmp_path: Path,
) -> None:
    """Trained on the window's batches, rolled back before it (the actuator's bound) and
    told to skip it: the same weights, optimizer and schedule as a run that skipped it from
    its start, which trained on every batch but exactly the window's."""
    every = {"ckpt_every": 3, "interval": "step"}  # the LR steps with the optimizer
    _, plain, plain_module = train(tmp_path / "plain", **every)
    _, reference, reference_module = train(tmp_path / "reference", skip=(WINDOW,), **every)
    train(tmp_path / "rolled", crash_after=6, **every)  # the window trained, saved at 6
    goodput, rolled, module = train(
        tmp_path / "rolled", skip=(WINDOW,), restore_before=WINDOW.first, **every
    )
    assert goodput.restored is not None and goodput.restored.step == 3
    assert rolled.global_step == reference.global_step == plain.global_step == 12
    assert reference_module.seen == plain_module.seen[:4] + plain_module.seen[6:]
    assert module.seen == plain_module.seen[3:4] + plain_module.seen[6:]
    assert goodput.shim.reported == [4, *range(7, 13)]  # a skipped step is not reported
    assert_identical(weights(rolled), weights(reference))
    # the optimizer and the per-step schedule moved for the 10 steps trained, not the skipped
    state = weights(rolled)
    assert state["lr_schedulers"][0]["last_epoch"] == 10
    assert {int(s["step"]) for s in state["optimizer_states"][0]["state"].values()} == {10}
    with pytest.raises(AssertionError, match="differs"):
        assert_identical(weights(reference), weights(plain))


class ManualRegression(Regression):
    """Optimizes by hand: its steps are its own, so none can be skipped for it."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.automatic_optimization = False

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        optimizer = self.optimizers()
        optimizer.zero_grad()
        loss = super().training_step(batch, batch_idx)
        self.manual_backward(loss)
        optimizer.step()
        return loss


def test_a_module_optimizing_by_hand_trains_on_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    goodput, trainer, _ = train(
        tmp_path, skip=(WINDOW,), scheduler=False, module_type=ManualRegression
    )
    assert "optimizes manually: it trains on their batches" in caplog.text
    # every step trained is reported, the window's too
    assert trainer.global_step == 12 and goodput.shim.reported == list(range(1, 13))


def test_two_ddp_ranks_skip_a_window_together(tmp_path: Path) -> None:
    """Under DDP (two processes, gloo): Lightning's own skip (a None loss) raises there, the
    zero gradients goodput gives a skipped step are reduced like any, and both ranks end
    with the same weights, the optimizer and per-step schedule moved for the trained steps
    only."""
    port = free_port()
    script = Path(__file__).with_name("lightning_ddp_skip.py")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOODPUT_")}
    env |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "LOCAL_RANK": "0"}
    env |= {"WORLD_SIZE": "2", "PYTHONPATH": os.pathsep.join([*sys.path, str(REPO)])}
    ranks = [
        subprocess.Popen(
            [sys.executable, str(script), str(tmp_path / f"rank{r}.pt"), str(tmp_path / f"{r}")],
            env={**env, "NODE_RANK": str(r)},
            stdout=subprocess.DEVNULL,
            stderr=open(tmp_path / f"rank{r}.log", "wb"),  # noqa: SIM115
        )
        for r in (0, 1)
    ]
    codes = [rank.wait(300) for rank in ranks]
    logs = "".join((tmp_path / f"rank{r}.log").read_text()[-2000:] for r in (0, 1))
    assert codes == [0, 0], logs
    first, second = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1))
    assert first["step"] == second["step"] == 8
    assert_identical(first["state_dict"], second["state_dict"])
    assert first["lr_schedulers"][0]["last_epoch"] == 6  # 8 steps, 3-4 skipped
    assert {int(s["step"]) for s in first["optimizer_states"][0]["state"].values()} == {6}


def test_keep_global_batch_from_two_ranks_to_one_accumulates_two_batches(tmp_path: Path) -> None:
    _, _, reference = train(tmp_path / "reference")
    # rank 0 of 2 (each rank a node of its own) trains on its half of each global batch
    _, two, half = train(tmp_path / "two", crash_after=4, world_size=2)
    assert two.accumulate_grad_batches == 1
    assert all(
        set(mine) < set(whole) for mine, whole in zip(half.seen, reference.seen[:4], strict=True)
    )
    goodput, one, module = train(tmp_path / "two", world_size=1)
    assert goodput.restored is not None and goodput.restored.rescaled
    assert one.accumulate_grad_batches == 2 and goodput.plan == PLAN
    assert module.seen == reference.seen[4:]  # the same global batches, in order
    # one report (vote, save) per optimizer step, none for the first micro-batch of one
    assert goodput.shim.reported == list(range(5, 13))  # type: ignore[attr-defined]


def test_scale_lr_without_a_scheduler_scales_the_optimizer(tmp_path: Path) -> None:
    rule = [scale_lr("linear", **LIGHTNING_KEYS)]
    train(tmp_path / "run", crash_after=4, world_size=2, rescale=rule, scheduler=False)
    goodput, _, _ = train(tmp_path / "run", world_size=1, rescale=rule, scheduler=False)
    assert goodput.restored is not None
    groups = goodput.restored.state["optimizer_states"][0]["param_groups"]
    assert groups[0]["lr"] == pytest.approx(PLAN.lr / 2)
    assert goodput.plan == BatchPlan(global_batch=4, micro_batch=4, lr=PLAN.lr / 2)


def test_a_loader_batching_otherwise_than_the_plan_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DataPositionError, match=r"batch_size \(8\) is not the batch plan's"):
        train(tmp_path / "run", batch_size=8)


def test_a_job_resumed_at_its_last_step_finishes_without_training(tmp_path: Path) -> None:
    # a rank that restarts after its job's last checkpoint (another node's copy of it, in a
    # job whose ranks do not wait for each other) has nothing left to train; Lightning then
    # skips its train hooks, and the shim must still be told the job is done
    first, _, _ = train(tmp_path / "run")
    assert first.shim.finished == [12]  # type: ignore[attr-defined]
    again, trainer, module = train(tmp_path / "run")
    assert again.restored is not None and again.restored.step == 12
    assert trainer.global_step == 12 and module.seen == []
    assert again.shim.finished == [12]  # type: ignore[attr-defined]
