"""The shim's save path: the buffer prepared at restore, and saves overlapped once guarded.

``restore`` allocates and touches the host buffer the first save then reuses (so the first
save does not fault it in inside a step). With ``guard(optimizer)`` a save returns with its
copy still pending — the next ``optimizer.step()`` waits for it — and what is restored is
the state at save time, not the one the step changed right after; without a guard nothing is
pending once ``save`` returns (white-box: the engine's list of copies an optimizer step must
wait for, as tests/ckpt/test_ckpt_overlap.py reads it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from goodput.checkpoint.engine import CheckpointEngine
from goodput.shim.trainer import ShimConfig, TrainerShim


def _shim(directory: Path) -> TrainerShim:
    return TrainerShim(ShimConfig(job="j", ckpt_dir=str(directory)), install_signal_handlers=False)


def _training() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    _step(model, optimizer)  # Adam's moments exist from here on
    return model, optimizer


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    model(torch.randn(8, 64)).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}


def _engine(shim: TrainerShim) -> CheckpointEngine:
    assert isinstance(shim.engine, CheckpointEngine)
    return shim.engine


def test_restore_prepares_the_buffer_the_first_save_reuses(tmp_path: Path) -> None:
    model, optimizer = _training()
    shim = _shim(tmp_path)
    assert shim.restore(_state(model, optimizer)) is None
    [slot] = _engine(shim)._slots
    prepared = slot.buffer
    assert prepared is not None and prepared.capacity >= 2 * 64 * 65 * 4  # weights, bias
    shim.save(_state(model, optimizer), 1)
    _engine(shim).wait_until_idle()
    assert [s.buffer for s in _engine(shim)._slots] == [prepared]
    shim.finish(_state(model, optimizer), 1)


def test_a_guarded_save_overlaps_the_next_step_and_restores_the_state_at_save_time(
    tmp_path: Path,
) -> None:
    model, optimizer = _training()
    shim = _shim(tmp_path)
    shim.restore(_state(model, optimizer))
    shim.guard(optimizer)
    at_save = {k: v.clone() for k, v in model.state_dict().items()}
    shim.save(_state(model, optimizer), 1)
    assert _engine(shim)._copying  # returned with the copy pending
    _step(model, optimizer)  # the guard waits for the copy before changing the weights
    assert not _engine(shim)._copying
    assert not torch.equal(model.weight, at_save["weight"])
    shim.finish(_state(model, optimizer), 1)

    fresh_model, fresh_optimizer = _training()
    restored = _shim(tmp_path).restore(_state(fresh_model, fresh_optimizer))
    assert restored is not None and restored.step == 1
    for name, tensor in fresh_model.state_dict().items():
        assert torch.equal(tensor, at_save[name]), name


def test_an_unguarded_save_returns_with_its_copy_done(tmp_path: Path) -> None:
    model, optimizer = _training()
    shim = _shim(tmp_path)
    shim.restore(_state(model, optimizer))
    shim.save(_state(model, optimizer), 1)
    assert not _engine(shim)._copying
    shim.finish(_state(model, optimizer), 1)
