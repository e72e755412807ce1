"""GoodputTrainerCallback in this process with a real Hugging Face Trainer (no bus): a stop
command ends training after a final save, the resume is bit-identical to an uninterrupted run,
and a resume at another data-parallel size runs the rescale callbacks on the Trainer's state."""

from __future__ import annotations

import math
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from goodput import schemas
from goodput.shim import BatchPlan, ShimConfig, TrainerShim, keep_global_batch, scale_lr
from goodput.shim.rescale import RescaleCallback
from tests.integrations.extras import require
from tests.integrations.harness import assert_identical

transformers = require("transformers")

from goodput.integrations.hf_trainer import GoodputTrainerCallback  # noqa: E402

LR = 1e-2
PLAN = BatchPlan(global_batch=32, micro_batch=16, lr=LR)  # 16 per rank on 2 ranks


class Regression(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1)
        )

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.mse_loss(self.net(inputs), targets)}


class StopAt(transformers.TrainerCallback):
    """Sends the shim a stop command after ``step`` (as the supervisor would)."""

    def __init__(self, shim: TrainerShim, step: int) -> None:
        self.shim, self.step = shim, step

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        if state.global_step == self.step:
            self.shim._on_command(schemas.Stop(job="j", reason="test"))


def train(
    directory: Path,
    *,
    stop_at: int | None = None,
    world_size: int = 1,
    rescale: list[RescaleCallback] | None = None,
    skip: tuple[schemas.StepWindow, ...] = (),
    restore_before: int | None = None,
) -> tuple[GoodputTrainerCallback, transformers.Trainer]:
    torch.manual_seed(0)
    inputs = torch.randn(64, 4)
    data = [{"inputs": x, "targets": x.sum(dim=0, keepdim=True)} for x in inputs]
    config = ShimConfig(
        ckpt_dir=str(directory / "ckpt"),
        ckpt_every=4,
        world_size=world_size,
        skip_steps=skip,
        restore_before_step=restore_before,
    )
    shim = TrainerShim(config, install_signal_handlers=False)
    goodput = GoodputTrainerCallback(shim=shim, plan=PLAN, rescale=rescale or [])
    # the stop arrives before goodput's callback looks at this step
    callbacks = [StopAt(shim, stop_at)] if stop_at is not None else []
    callbacks.append(goodput)
    args = transformers.TrainingArguments(
        output_dir=str(directory / "trainer"),
        max_steps=10,
        per_device_train_batch_size=16,
        learning_rate=LR,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = transformers.Trainer(
        model=Regression(), args=args, train_dataset=data, callbacks=callbacks
    )
    trainer.train(resume_from_checkpoint=goodput.resume_path(trainer.args))
    return goodput, trainer


def final_state(directory: Path) -> dict:
    reader = TrainerShim(
        ShimConfig(ckpt_dir=str(directory / "ckpt")), install_signal_handlers=False
    )
    restored = reader.restore({})
    assert restored is not None
    return {"step": restored.step, **restored.state}


def test_a_stopped_training_resumes_bit_identically(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    scratch = tmp_path / "scratch"  # where resume_path writes the Trainer checkpoint directory
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    _, reference = train(tmp_path / "reference")
    stopped, first = train(tmp_path / "resumed", stop_at=6)
    assert first.state.global_step == 6 and stopped.restored is None
    _, resumed = train(tmp_path / "resumed")
    assert resumed.state.global_step == reference.state.global_step == 10
    expected, actual = final_state(tmp_path / "reference"), final_state(tmp_path / "resumed")
    assert_identical(actual, expected)
    assert not list(scratch.iterdir())  # removed when training ended


WINDOW = schemas.StepWindow(5, 6)


def test_a_spike_window_rolled_back_and_skipped_ends_as_a_run_that_skipped_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trained on the window's batches, rolled back before it (the actuator's bound) and
    told to skip it: the same weights, optimizer, schedule, RNG and Trainer state as a run
    that skipped it from its start, whose optimizer and schedule stepped for the 8 steps
    trained only."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    train(tmp_path / "plain")
    _, reference = train(tmp_path / "reference", skip=(WINDOW,))
    train(tmp_path / "rolled", stop_at=6)  # the window trained, saved at 4 and 6
    goodput, rolled = train(tmp_path / "rolled", skip=(WINDOW,), restore_before=WINDOW.first)
    assert goodput.restored is not None and goodput.restored.step == 4
    assert rolled.state.global_step == reference.state.global_step == 10
    expected, actual = final_state(tmp_path / "reference"), final_state(tmp_path / "rolled")
    assert_identical(actual, expected)
    assert {int(s["step"]) for s in actual["optimizer"]["state"].values()} == {8}
    assert actual["scheduler"]["last_epoch"] == 8
    with pytest.raises(AssertionError, match="differs"):
        assert_identical(actual["model"], final_state(tmp_path / "plain")["model"])


def test_a_resume_at_another_dp_size_runs_the_rescale_callbacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    train(tmp_path, stop_at=4, world_size=2)
    resumer, trainer = train(tmp_path, rescale=[scale_lr("linear")])
    assert resumer.restored is not None and resumer.restored.step == 4
    assert resumer.restored.saved_layout.dp_size == 2 and resumer.restored.layout.dp_size == 1
    assert resumer.plan is not None and math.isclose(resumer.plan.lr, LR / 2)
    # the Trainer resumed with the scaled optimizer and scheduler (linear decay from LR / 2)
    assert math.isclose(trainer.lr_scheduler.base_lrs[0], LR / 2)


def test_keep_global_batch_accumulates_more_on_fewer_ranks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _, first = train(tmp_path, stop_at=4, world_size=2)
    assert first.args.gradient_accumulation_steps == 1  # 2 ranks x 16 = the global batch of 32
    resumer, trainer = train(tmp_path, rescale=[keep_global_batch])
    assert resumer.plan == PLAN
    assert trainer.args.gradient_accumulation_steps == 2
    assert trainer.current_gradient_accumulation_steps == 2  # micro-batches the last step ran


def test_a_plan_that_does_not_match_the_trainer_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys.modules[__name__], "PLAN", BatchPlan(global_batch=32, lr=LR))
    with pytest.raises(ValueError, match="micro_batch"):
        train(tmp_path)


@pytest.mark.timeout(600)  # four Trainer processes, two of them side by side
def test_after_two_to_one_ranks_the_trainer_goes_on_with_the_plans_global_batches(
    tmp_path: Path,
) -> None:
    """Two ranks of one node train data parallel (the Trainer's own sharded sampler) and are
    stopped mid-epoch; one rank resumes with ``keep_global_batch``: it accumulates two
    micro-batches a step and trains on the same global batches, in the same order, as one
    rank that ran the plan from the start."""
    from tests.integrations.hf_rank import PLAN as RANK_PLAN
    from tests.integrations.hf_rank import run_ranks

    outs = {name: tmp_path / name for name in ("reference", "two", "one")}
    for out in outs.values():
        out.mkdir()
    (reference,) = run_ranks(tmp_path / "reference-ckpt", outs["reference"], world=1)
    assert reference["accumulation"] == 2 and len(reference["steps"]) == 10
    # told at step 5, both ranks stop after step 6: the stop vote is read one step late
    two = run_ranks(tmp_path / "ckpt", outs["two"], world=2, stop_at=5)
    assert [r["accumulation"] for r in two] == [1, 1]
    for step, (zero, one, whole) in enumerate(
        zip(two[0]["steps"], two[1]["steps"], reference["steps"][:6], strict=True)
    ):
        assert len(zero) == len(one) == RANK_PLAN.micro_batch, step  # each its own shard
        assert sorted(zero + one) == sorted(whole), step
    (resumed,) = run_ranks(tmp_path / "ckpt", outs["one"], world=1)
    assert (resumed["restored"], resumed["global_step"]) == (6, 10)
    assert (resumed["accumulation"], resumed["lr"]) == (2, RANK_PLAN.lr)
    assert resumed["steps"] == reference["steps"][6:]


@pytest.mark.timeout(600)  # two Trainer processes side by side
def test_two_data_parallel_ranks_skip_a_window_together(tmp_path: Path) -> None:
    """Two ranks (accelerate's gloo group) told to skip steps 3-4: the gradients each drops
    were reduced across both, and both end with the same weights, the optimizer and the LR
    scheduler stepped for the 8 steps trained only."""
    from tests.integrations.hf_rank import run_ranks

    two = run_ranks(tmp_path / "ckpt", tmp_path, world=2, skip="3-4")
    for rank in two:
        assert rank["global_step"] == 10
        assert (rank["optimizer_steps"], rank["scheduler_steps"]) == ({8}, 8)
    assert_identical(two[0]["weights"], two[1]["weights"])
