"""Trainer in one process: full-state round trip, rescale plans, LR schedule, accumulation math."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from goodput.examples.gpt.model import ModelConfig
from goodput.examples.gpt.training import TrainConfig, Trainer, WarmupCosine, params_sha256
from goodput.shim.rescale import BatchPlan, RescaleCallback, scale_lr
from goodput.shim.restore_result import (
    CheckpointMetadata,
    DpLayout,
    resolve_restore,
    with_metadata,
)

TINY = TrainConfig(
    seed=4,
    total_steps=20,
    warmup_steps=2,
    plan=BatchPlan(global_batch=4, micro_batch=1, lr=3e-3),
    model=ModelConfig(n_layer=1, d_model=32, n_head=2, seq_len=16),
    corpus_chars=20_000,
)


def trained(config: TrainConfig, steps: int) -> Trainer:
    trainer = Trainer(config)
    for _ in range(steps):
        trainer.train_step()
    return trainer


def test_state_round_trip_through_a_file_resumes_bit_exactly(tmp_path: Path) -> None:
    uninterrupted = trained(TINY, 6)

    first_half = trained(TINY, 3)
    torch.save(first_half.state_dict(), tmp_path / "state.pt")
    resumed = Trainer(TINY)
    resumed.load_state_dict(torch.load(tmp_path / "state.pt", weights_only=True))
    assert resumed.step == 3
    for _ in range(3):
        resumed.train_step()
    assert params_sha256(resumed.model) == params_sha256(uninterrupted.model)


def test_rng_states_are_part_of_the_state() -> None:
    trainer = trained(TINY, 1)
    state = trainer.state_dict()
    expected = (random.random(), float(np.random.random()), torch.rand(1).item())
    random.seed(99)
    np.random.seed(99)
    torch.manual_seed(99)
    Trainer(TINY).load_state_dict(state)
    assert (random.random(), float(np.random.random()), torch.rand(1).item()) == expected


def test_params_hash_tracks_the_parameters() -> None:
    trainer = Trainer(TINY)
    before = params_sha256(trainer.model)
    assert before == params_sha256(Trainer(TINY).model)
    trainer.train_step()
    assert params_sha256(trainer.model) != before


def test_gradient_accumulation_matches_one_big_micro_batch() -> None:
    # Without dropout the micro-batch layout is the only difference: same math, other rounding.
    no_dropout = replace(TINY, model=replace(TINY.model, dropout=0.0))
    accumulated = trained(no_dropout, 3)
    single = trained(replace(no_dropout, plan=BatchPlan(global_batch=4, micro_batch=4, lr=3e-3)), 3)
    for name, value in accumulated.model.state_dict().items():
        torch.testing.assert_close(value, single.model.state_dict()[name], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("format", 99, "format"),
        ("model_config", {"n_layer": 9}, "model"),
        ("data", {"seed": 123, "step": 0}, "seed"),
    ],
)
def test_foreign_states_are_rejected(field: str, value: object, message: str) -> None:
    state = Trainer(TINY).state_dict()
    state[field] = value
    with pytest.raises(ValueError, match=message):
        Trainer(TINY).load_state_dict(state)


def rescaled(
    state: dict, old_world: int, new_world: int, callbacks: list[RescaleCallback]
) -> tuple[dict, BatchPlan | None]:
    """``state`` as restored by ranks at ``new_world`` from a checkpoint saved at ``old_world``."""
    saved = with_metadata(
        state,
        CheckpointMetadata(
            layout=DpLayout(world_size=old_world, dp_size=old_world), plan=TINY.plan
        ),
    )
    layout = DpLayout(world_size=new_world, dp_size=new_world)
    result, _ = resolve_restore(
        0, saved, tier="local", layout=layout, plan=TINY.plan, callbacks=callbacks
    )
    return result.state, result.plan


def test_resuming_at_another_world_size_applies_the_rescale_callbacks() -> None:
    # A state recorded at world 2, resumed by a world-1 trainer with linear LR scaling.
    source = trained(TINY, 4)
    state, plan = rescaled(source.state_dict(), 2, 1, [scale_lr("linear")])
    assert plan == BatchPlan(global_batch=2, micro_batch=1, lr=TINY.plan.lr / 2)
    target = Trainer(TINY)
    target.load_state_dict(state, plan)
    for group, source_group in zip(
        target.optimizer.param_groups, source.optimizer.param_groups, strict=True
    ):
        assert math.isclose(group["lr"], source_group["lr"] / 2)
    target.train_step()
    assert target.tokens_per_step == 2 * TINY.model.seq_len


def test_warmup_then_cosine_down_to_the_floor() -> None:
    schedule = WarmupCosine(warmup_steps=4, total_steps=20, min_ratio=0.1)
    assert [schedule(step) for step in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert schedule(4) == 1.0
    assert schedule(12) == pytest.approx(0.55)
    assert schedule(20) == pytest.approx(0.1) and schedule(50) == pytest.approx(0.1)


def test_distributed_world_needs_a_process_group() -> None:
    with pytest.raises(RuntimeError, match="distributed"):
        Trainer(TINY, rank=0, world_size=2)


@pytest.mark.slow
def test_loss_falls_over_a_few_hundred_steps() -> None:
    config = TrainConfig(
        seed=0, total_steps=200, model=ModelConfig(n_layer=2, d_model=64), corpus_chars=100_000
    )
    trainer = Trainer(config)
    losses = [trainer.train_step() for _ in range(config.total_steps)]
    first, last = np.mean(losses[:10]), np.mean(losses[-20:])
    assert first > 3.0  # near uniform over the 32-token vocabulary at the start
    assert last < 0.65 * first, (first, last)


def test_an_injected_slowdown_stretches_the_compute_it_is_measured_in(monkeypatch) -> None:
    """Each delay is (factor - 1) × the previous step's own compute, counted in this step's
    compute time, and never grows from an earlier delay (which would compound the factor)."""
    import goodput.examples.gpt.training as training

    delays: list[float] = []
    real_sleep = training.time.sleep

    def recorded_sleep(seconds: float) -> None:
        delays.append(seconds)
        real_sleep(seconds)

    monkeypatch.setattr(training.time, "sleep", recorded_sleep)
    trainer = trained(TINY, 1)
    computes = [trainer.last_compute_time_s]
    for _ in range(3):
        trainer.train_step(slowdown=1.5)
        computes.append(trainer.last_compute_time_s)
    undelayed = [computes[0]] + [c - d for c, d in zip(computes[1:], delays, strict=True)]
    assert len(delays) == 3
    for step, delay in enumerate(delays):
        assert delay == pytest.approx(0.5 * undelayed[step])
        assert computes[step + 1] > delay  # the wait is inside the measured compute
    trainer.train_step()
    assert len(delays) == 3  # factor 1: no delay
