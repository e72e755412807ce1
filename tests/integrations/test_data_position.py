"""The data position is part of the checkpoint: a plain loop stopped mid-epoch resumes on the
next unseen batch (bit-identical), and after 2 -> 1 data-parallel ranks under
``keep_global_batch`` it trains on the same global batches in the same order."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from goodput import schemas
from goodput.integrations.loop import SupervisedLoop
from goodput.shim import BatchPlan, ShimConfig, TrainerShim, keep_global_batch
from goodput.shim.data_position import DataPositionError, ResumableSampler
from tests.integrations.harness import SAMPLES, Indexed, assert_identical

PLAN = BatchPlan(global_batch=8, micro_batch=4, lr=1e-2)


def train(
    directory: Path,
    total_steps: int,
    *,
    ckpt_every: int,
    stop_after: int | None = None,
    world_size: int = 1,
    rank: int = 0,
    skip_steps: tuple[schemas.StepWindow, ...] = (),
) -> tuple[SupervisedLoop, list[list[int]]]:
    """The loop on one rank of ``world_size`` (no process group: each rank's data is what this
    test checks); returns the sample indices each step trained on."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=PLAN.lr)
    config = ShimConfig(
        ckpt_dir=str(directory),
        ckpt_every=ckpt_every,
        world_size=world_size,
        rank=rank,
        skip_steps=skip_steps,
    )
    loader = torch.utils.data.DataLoader(
        Indexed(), batch_size=PLAN.micro_batch, sampler=ResumableSampler(SAMPLES, seed=3)
    )
    loop = SupervisedLoop(
        shim=TrainerShim(config, install_signal_handlers=False),
        plan=PLAN,
        rescale=[keep_global_batch],
        data=loader,
        model=model,
        optimizer=optimizer,
    )
    seen: list[list[int]] = []
    for step in loop.steps(total_steps):
        indices: list[int] = []
        for index, features in loop.micro_batches():
            loss = model(features).square().mean() / loop.accumulation_steps
            loss.backward()
            indices += index.tolist()
        optimizer.step()
        optimizer.zero_grad()
        loop.step_done(loss, tokens=len(indices))
        seen.append(indices)
        if step == stop_after:
            break  # leaving the loop saves where it is, as a checkpoint at this step would
    return loop, seen


@pytest.mark.parametrize("ckpt_every", [3, 4, 7])
def test_a_loop_stopped_mid_epoch_resumes_on_the_next_unseen_batch(
    tmp_path: Path, ckpt_every: int
) -> None:
    reference, reference_seen = train(tmp_path / "reference", 12, ckpt_every=ckpt_every)
    first, first_seen = train(
        tmp_path / "resumed", 12, ckpt_every=ckpt_every, stop_after=ckpt_every
    )
    assert first.step == ckpt_every and first.data is not None
    resumed, resumed_seen = train(tmp_path / "resumed", 12, ckpt_every=ckpt_every)
    assert resumed.restored is not None and resumed.restored.step == ckpt_every
    assert first_seen + resumed_seen == reference_seen
    assert_identical(resumed.state(), reference.state())


def test_after_two_to_one_ranks_the_global_batches_go_on_in_order(tmp_path: Path) -> None:
    _, reference = train(tmp_path / "reference", 12, ckpt_every=4)
    # each of 2 ranks trains 4 steps on its half of every global batch, then stops (each its
    # own node's volume: rank 0's is resumed from)
    halves = [
        train(tmp_path / f"two{rank}", 12, ckpt_every=4, stop_after=4, world_size=2, rank=rank)[1]
        for rank in (0, 1)
    ]
    for step, (zero, one) in enumerate(zip(*halves, strict=True)):
        assert sorted(zero + one) == sorted(reference[step])
    # one rank resumes: accumulating 2 micro-batches, it trains on the rest of the epoch and
    # the next ones exactly as the uninterrupted run did
    one, seen = train(tmp_path / "two0", 12, ckpt_every=4, world_size=1)
    assert one.restored is not None and one.restored.rescaled
    assert one.accumulation_steps == 2 and one.plan == PLAN
    assert seen == reference[4:]


def test_a_skipped_window_draws_its_batches_and_trains_on_none(tmp_path: Path) -> None:
    """A loss spike's rollback: the steps of its window are counted and their batches drawn
    from the loader, and the steps after it train on what the uninterrupted run did, across
    an epoch's end (40 samples, 8 a step: an epoch is 5 steps) and a resume."""
    _, reference = train(tmp_path / "reference", 16, ckpt_every=4)
    window = (schemas.StepWindow(6, 7),)
    first, first_seen = train(
        tmp_path / "skipping", 16, ckpt_every=4, skip_steps=window, stop_after=9
    )
    assert first.skipped == [6, 7] and first.step == 9
    resumed, resumed_seen = train(tmp_path / "skipping", 16, ckpt_every=4, skip_steps=window)
    assert resumed.restored is not None and resumed.restored.step == 9
    assert resumed.skipped == [] and resumed.step == 16
    assert first_seen + resumed_seen == reference[:5] + reference[7:]


def test_a_loader_that_batches_otherwise_than_the_plan_is_refused(tmp_path: Path) -> None:
    loader = torch.utils.data.DataLoader(Indexed(), batch_size=8, sampler=ResumableSampler(SAMPLES))
    shim = TrainerShim(ShimConfig(ckpt_dir=str(tmp_path)), install_signal_handlers=False)
    loop = SupervisedLoop(shim=shim, plan=PLAN, data=loader, model=torch.nn.Linear(4, 1))
    with pytest.raises(DataPositionError, match=r"batch_size \(8\) is not the batch plan's micro"):
        next(iter(loop.steps(3)))


def test_a_loader_that_cannot_resume_mid_epoch_is_refused(tmp_path: Path) -> None:
    loader = torch.utils.data.DataLoader(Indexed(), batch_size=4, shuffle=True)
    shim = TrainerShim(ShimConfig(ckpt_dir=str(tmp_path)), install_signal_handlers=False)
    with pytest.raises(DataPositionError, match="cannot resume mid-epoch"):
        SupervisedLoop(shim=shim, plan=PLAN, data=loader, model=torch.nn.Linear(4, 1))


def test_the_sampler_deals_each_global_batch_to_the_ranks_in_order() -> None:
    one, two = ResumableSampler(SAMPLES, seed=5), [ResumableSampler(SAMPLES, seed=5) for _ in "ab"]
    one.bind(dp_rank=0, dp_size=1, plan=PLAN)
    for rank, sampler in enumerate(two):
        sampler.bind(dp_rank=rank, dp_size=2, plan=PLAN)
    order = list(one)
    halves = [list(sampler) for sampler in two]
    assert len(one) == SAMPLES and all(len(sampler) == SAMPLES // 2 for sampler in two)
    for batch in range(SAMPLES // PLAN.global_batch):
        window = slice(batch * 4, batch * 4 + 4)
        assert halves[0][window] + halves[1][window] == order[batch * 8 : batch * 8 + 8]
    one.advance(3 * PLAN.global_batch)
    assert list(one) == order[24:]  # mid-epoch: the rest of the epoch
    one.advance(2 * PLAN.global_batch)
    assert one.state_dict() == {"epoch": 1, "consumed": 0, "seed": 5}
    assert list(one) != order  # the next epoch, shuffled anew
