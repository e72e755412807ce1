"""Typed restore and the rescale callbacks, through the real shim and checkpoint engine (no bus)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from goodput.shim import (
    BatchPlan,
    Rescale,
    RescaleError,
    ShimConfig,
    TrainerShim,
    adjust_schedule,
    keep_global_batch,
    scale_lr,
)
from goodput.shim.rescale import BUILTIN_RULES
from goodput.shim.restore_result import METADATA_KEY

PLAN = BatchPlan(global_batch=12, micro_batch=2, lr=0.01)


def shim(directory: Path, world_size: int, **config: object) -> TrainerShim:
    return TrainerShim(
        ShimConfig(ckpt_dir=str(directory), world_size=world_size, **config),  # type: ignore[arg-type]
        install_signal_handlers=False,
    )


def training_state() -> tuple[
    torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler
]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=PLAN.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 / (1 + step))
    for _ in range(6):
        model(torch.randn(3, 4)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
    return model, optimizer, scheduler


def state_of(model, optimizer, scheduler) -> dict:
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
    }


def save_at(directory: Path, world_size: int, plan: BatchPlan = PLAN) -> dict:
    saver = shim(directory, world_size)
    assert saver.restore({}, plan=plan) is None
    state = state_of(*training_state())
    saver.save(state, 6)
    saver.finish(state, 6)
    return state


def test_restore_returns_step_state_layout_and_plan(tmp_path: Path) -> None:
    saved = save_at(tmp_path, 2)
    resumer = shim(tmp_path, 2, local_world_size=2)
    model, optimizer, scheduler = training_state()
    result = resumer.restore(state_of(model, optimizer, scheduler), plan=None)
    assert result is not None and result.step == 6 and result.tier == "local"
    assert result.saved_layout is not None and result.saved_layout.world_size == 2
    assert result.layout.procs_per_node == 2 and not result.rescaled
    assert result.plan == PLAN == resumer.plan  # the saved plan wins over none given
    assert METADATA_KEY not in result.state
    assert torch.equal(result.state["model"]["weight"], saved["model"]["weight"])


def test_same_data_parallel_size_runs_no_callback(tmp_path: Path) -> None:
    save_at(tmp_path, 2)
    resumer = shim(tmp_path, 2)
    calls: list[Rescale] = []
    resumer.on_rescale(calls.append)
    assert resumer.restore(state_of(*training_state())) is not None
    assert calls == []


def test_keep_global_batch_accumulates_more_per_rank(tmp_path: Path) -> None:
    save_at(tmp_path, 2)
    resumer = shim(tmp_path, 1)
    resumer.on_rescale(keep_global_batch)
    result = resumer.restore(state_of(*training_state()))
    assert result is not None and result.rescaled
    assert result.plan == PLAN and result.plan.accumulation_steps(1) == 6
    assert PLAN.accumulation_steps(2) == 3


def test_keep_global_batch_refuses_a_batch_that_does_not_split(tmp_path: Path) -> None:
    save_at(tmp_path, 2)
    resumer = shim(tmp_path, 5)
    resumer.on_rescale(keep_global_batch)
    with pytest.raises(RescaleError, match="not a whole number of micro-batches"):
        resumer.restore(state_of(*training_state()))


@pytest.mark.parametrize(("rule", "factor"), [("linear", 0.5), ("sqrt", math.sqrt(0.5))])
def test_scale_lr_keeps_the_per_rank_batch_and_scales_the_optimizer(
    tmp_path: Path, rule: str, factor: float
) -> None:
    saved = save_at(tmp_path, 2)
    resumer = shim(tmp_path, 1)
    resumer.on_rescale(scale_lr(rule))  # type: ignore[arg-type]
    model, optimizer, scheduler = training_state()
    result = resumer.restore(state_of(model, optimizer, scheduler))
    assert result is not None
    assert result.plan == BatchPlan(global_batch=6, micro_batch=2, lr=PLAN.lr * factor)
    optimizer.load_state_dict(result.state["optimizer"])
    scheduler.load_state_dict(result.state["scheduler"])
    saved_lr = saved["optimizer"]["param_groups"][0]["lr"]
    assert math.isclose(optimizer.param_groups[0]["lr"], saved_lr * factor)
    assert math.isclose(scheduler.base_lrs[0], PLAN.lr * factor)
    optimizer.step()
    scheduler.step()  # the schedule goes on from the scaled base
    assert math.isclose(optimizer.param_groups[0]["lr"], PLAN.lr * factor / 8)


def test_scale_down_then_up_comes_back_to_the_plan(tmp_path: Path) -> None:
    save_at(tmp_path / "a", 2)
    down = shim(tmp_path / "a", 1)
    down.on_rescale(scale_lr("sqrt"))
    state = down.restore(state_of(*training_state()))
    assert state is not None
    down.save(state.state, 7)
    down.finish(state.state, 7)
    up = shim(tmp_path / "a", 2)
    up.on_rescale(scale_lr("sqrt"))
    result = up.restore(state_of(*training_state()))
    assert result is not None and result.step == 7 and result.saved_layout.dp_size == 1  # type: ignore[union-attr]
    assert result.plan.global_batch == 12 and math.isclose(result.plan.lr, PLAN.lr)  # type: ignore[union-attr]


#: (global batch, accumulation steps, LR factor) after 2 -> 1 and back to 2 data-parallel ranks
#: under each rule the example job and the demo take by name (``--rescale``)
NAMED = {
    "keep-global-batch": [(12, 6, 1.0), (12, 3, 1.0)],
    "linear-lr": [(6, 3, 0.5), (12, 3, 1.0)],
    "sqrt-lr": [(6, 3, math.sqrt(0.5)), (12, 3, 1.0)],
}


@pytest.mark.parametrize("name", sorted(NAMED))
def test_each_named_rule_scales_down_and_back_up(tmp_path: Path, name: str) -> None:
    assert set(NAMED) == set(BUILTIN_RULES)
    save_at(tmp_path, 2)
    for step, world_size in ((7, 1), (8, 2)):
        resumer = shim(tmp_path, world_size)
        for callback in BUILTIN_RULES[name]():
            resumer.on_rescale(callback)
        result = resumer.restore(state_of(*training_state()))
        assert result is not None and result.rescaled and result.plan is not None
        batch, accumulation, factor = NAMED[name][world_size == 2]
        assert result.plan.global_batch == batch
        assert result.plan.accumulation_steps(world_size) == accumulation
        assert math.isclose(result.plan.lr, PLAN.lr * factor)
        resumer.save(result.state, step)
        resumer.finish(result.state, step)


def test_adjust_schedule_counts_samples_not_steps(tmp_path: Path) -> None:
    save_at(tmp_path, 2)
    resumer = shim(tmp_path, 1)
    resumer.on_rescale(scale_lr("linear"))
    resumer.on_rescale(adjust_schedule())
    model, optimizer, scheduler = training_state()
    result = resumer.restore(state_of(model, optimizer, scheduler))
    assert result is not None
    # 6 steps of 12 samples are 12 steps of 6
    assert result.state["scheduler"]["last_epoch"] == 12


def test_a_rule_that_needs_the_plan_says_so(tmp_path: Path) -> None:
    save_at(tmp_path, 2, plan=PLAN)
    directory = tmp_path / "no-plan"
    saver = shim(directory, 2)
    saver.restore({})
    saver.save({"w": torch.zeros(2)}, 1)
    saver.finish({"w": torch.zeros(2)}, 1)
    resumer = shim(directory, 1)
    resumer.on_rescale(keep_global_batch)
    with pytest.raises(RescaleError, match="pass plan="):
        resumer.restore({"w": torch.zeros(2)})


def test_a_missing_state_dict_is_named(tmp_path: Path) -> None:
    save_at(tmp_path, 2)
    resumer = shim(tmp_path, 1)
    resumer.on_rescale(scale_lr("linear", optimizer_key="opt"))
    with pytest.raises(RescaleError, match="'opt'"):
        resumer.restore(state_of(*training_state()))


def test_the_reserved_key_is_refused(tmp_path: Path) -> None:
    saver = shim(tmp_path, 1)
    saver.restore({})
    with pytest.raises(ValueError, match="reserved"):
        saver.save({METADATA_KEY: 1}, 1)
    saver.finish({}, 0)


def test_a_dotted_key_reaches_into_a_lightning_checkpoint(tmp_path: Path) -> None:
    saver = shim(tmp_path, 2)
    saver.restore({}, plan=PLAN)
    _, optimizer, scheduler = training_state()
    state = {
        "optimizer_states": [optimizer.state_dict()],
        "lr_schedulers": [scheduler.state_dict()],
    }
    saver.save(state, 6)
    saver.finish(state, 6)
    resumer = shim(tmp_path, 1)
    resumer.on_rescale(
        scale_lr("linear", optimizer_key="optimizer_states.0", scheduler_key="lr_schedulers.0")
    )
    result = resumer.restore({})
    assert result is not None
    saved_lr = state["optimizer_states"][0]["param_groups"][0]["lr"]
    restored_lr = result.state["optimizer_states"][0]["param_groups"][0]["lr"]
    assert math.isclose(restored_lr, saved_lr / 2)
    assert math.isclose(result.state["lr_schedulers"][0]["base_lrs"][0], PLAN.lr / 2)
