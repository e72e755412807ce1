"""Overlapped snapshots: the copy runs during forward/backward, the optimizer step waits."""

from __future__ import annotations

import copy
import threading
from pathlib import Path

import pytest
import torch

from goodput.checkpoint.engine import CheckpointEngine, snapshot
from goodput.checkpoint.engine import engine as engine_module

from .helpers import assert_bit_exact


def _training() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.Linear(128, 4))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    model(torch.randn(8, 128)).sum().backward()
    optimizer.step()
    return model, optimizer


def _state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    return {"model": model.state_dict(), "optim": optimizer.state_dict()}


@pytest.mark.parametrize("copy_threads", [1, 2])
def test_overlapped_save_holds_the_state_at_save_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, copy_threads: int
) -> None:
    monkeypatch.setattr(snapshot, "COPY_CHUNK_BYTES", 4096)  # many chunks over both threads
    model, optimizer = _training()
    with CheckpointEngine(tmp_path, copy_threads=copy_threads) as engine:
        engine.guard(optimizer)
        at_save = copy.deepcopy(_state(model, optimizer))
        handle = engine.save(_state(model, optimizer), 1, overlap=True)
        model(torch.randn(8, 128)).sum().backward()
        optimizer.step()  # the guard waits for the copy before Adam changes the tensors
        assert not torch.equal(model[0].weight, at_save["model"]["0.weight"])
        assert handle.wait().ok
        _, restored = engine.restore()
    assert_bit_exact(at_save, restored)


def test_snapshotted_and_wait_snapshot_end_the_copy(tmp_path: Path) -> None:
    model, optimizer = _training()
    with CheckpointEngine(tmp_path) as engine:
        handle = engine.save(_state(model, optimizer), 1, overlap=True)
        handle.snapshotted()
        assert handle.copy is not None and handle.copy.done()
        second = engine.save(_state(model, optimizer), 2, overlap=True)
        engine.wait_snapshot()
        assert second.copy is not None and second.copy.done()
        assert second.wait().ok


def test_blocking_save_has_nothing_left_to_wait_for(tmp_path: Path) -> None:
    model, optimizer = _training()
    with CheckpointEngine(tmp_path) as engine:
        handle = engine.save(_state(model, optimizer), 1)
        assert handle.copy is None
        assert handle.wait().ok


def test_an_overlapped_save_plans_and_copies_off_the_training_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``save`` returns before the plan exists; the guard then waits for planning and copy."""
    model, optimizer = _training()
    planning = threading.Event()
    release = threading.Event()
    real_plan_save = engine_module.plan_save

    def held_plan_save(*args: object, **kwargs: object) -> object:
        planning.set()
        release.wait()
        return real_plan_save(*args, **kwargs)

    monkeypatch.setattr(engine_module, "plan_save", held_plan_save)
    with CheckpointEngine(tmp_path) as engine:
        engine.guard(optimizer)
        at_save = copy.deepcopy(_state(model, optimizer))
        handle = engine.save(_state(model, optimizer), 1, overlap=True)
        assert planning.wait(10) and handle.copy is not None and not handle.copy.done()
        release.set()
        model(torch.randn(8, 128)).sum().backward()
        optimizer.step()
        assert handle.copy.done() and handle.wait().ok
        _, restored = engine.restore()
    assert_bit_exact(at_save, restored)


def test_an_overlapped_save_whose_planning_fails_is_a_failed_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A problem on the planner thread fails that save; the optimizer step does not hang."""
    model, optimizer = _training()

    def failing_plan_save(*args: object, **kwargs: object) -> object:
        raise RuntimeError("injected planning failure")

    monkeypatch.setattr(engine_module, "plan_save", failing_plan_save)
    events: list[object] = []
    with CheckpointEngine(tmp_path, listener=events.append) as engine:
        engine.guard(optimizer)
        handle = engine.save(_state(model, optimizer), 1, overlap=True)
        optimizer.step()
        result = handle.wait()
        assert result.status == "failed" and "injected planning failure" in (result.error or "")
        assert handle.copy is not None and handle.copy.done()
    assert [type(event).__name__ for event in events] == ["CheckpointFailed"]
