"""LocalFileHooks and the training loop in one process (world size 1)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch

from goodput.examples.gpt.local_hooks import (
    LocalFileHooks,
    checkpoint_path,
    list_checkpoints,
    write_atomically,
)
from goodput.examples.gpt.loop import run_training
from goodput.examples.gpt.model import ModelConfig
from goodput.examples.gpt.training import TrainConfig, Trainer, params_sha256
from goodput.shim.rescale import BatchPlan

TINY = TrainConfig(
    seed=2,
    total_steps=10,
    warmup_steps=2,
    plan=BatchPlan(global_batch=2, micro_batch=1, lr=3e-3),
    model=ModelConfig(n_layer=1, d_model=32, n_head=2, seq_len=16),
    corpus_chars=20_000,
)
TEMPLATE = {"step": 0, "model": {}}


def hooks(directory: Path, every: int = 3, **kwargs: object) -> LocalFileHooks:
    return LocalFileHooks(directory, every, handle_sigterm=False, log_every=0, **kwargs)


def test_restore_returns_the_newest_checkpoint(tmp_path: Path) -> None:
    writer = hooks(tmp_path)
    for step in (3, 6):
        writer.save({"step": step, "model": {"w": torch.full((2,), float(step))}}, step)
    writer.finish({"step": 6, "model": {}}, 6)  # already saved: nothing new written
    assert [step for step, _ in list_checkpoints(tmp_path)] == [6, 3]
    restored = hooks(tmp_path).restore(TEMPLATE)
    assert restored is not None and restored.step == 6
    assert torch.equal(restored.state["model"]["w"], torch.full((2,), 6.0))
    assert restored.saved_layout == restored.layout and not restored.rescaled


def test_empty_directory_restores_nothing(tmp_path: Path) -> None:
    assert hooks(tmp_path / "new").restore(TEMPLATE) is None


def test_save_snapshots_before_returning(tmp_path: Path) -> None:
    live = torch.zeros(1000)
    writer = hooks(tmp_path)
    writer.save({"step": 3, "model": {"w": live}}, 3)
    live.fill_(7.0)  # training goes on while the write may still run
    writer.finish({"step": 3, "model": {}}, 3)
    restored = hooks(tmp_path).restore(TEMPLATE)
    assert restored is not None and torch.count_nonzero(restored.state["model"]["w"]) == 0


def test_corrupt_and_foreign_checkpoints_fall_back_to_an_older_one(tmp_path: Path) -> None:
    write_atomically({"step": 3, "model": {}}, checkpoint_path(tmp_path, 3))
    write_atomically({"step": 6, "model": {}}, checkpoint_path(tmp_path, 6))
    truncated = checkpoint_path(tmp_path, 6).read_bytes()[:50]
    checkpoint_path(tmp_path, 6).write_bytes(truncated)
    torch.save([1, 2, 3], checkpoint_path(tmp_path, 9))  # not a training state
    torch.save({"step": 12}, checkpoint_path(tmp_path, 12))  # lacks the model
    (tmp_path / ".step-00000015.pt.tmp-123").write_bytes(b"interrupted write")
    restored = hooks(tmp_path).restore(TEMPLATE)
    assert restored is not None and restored.step == 3
    assert restored.saved_layout is None  # written without goodput's metadata


def test_only_the_newest_checkpoints_are_kept(tmp_path: Path) -> None:
    writer = hooks(tmp_path, every=1, keep=2)
    for step in range(1, 6):
        writer.save({"step": step, "model": {}}, step)
    writer.finish({"step": 5, "model": {}}, 5)
    assert [step for step, _ in list_checkpoints(tmp_path)] == [5, 4]


def test_other_ranks_do_not_write(tmp_path: Path) -> None:
    writer = hooks(tmp_path, rank=1)
    writer.save({"step": 3, "model": {}}, 3)
    writer.finish({"step": 4, "model": {}}, 4)
    assert list_checkpoints(tmp_path) == []


def test_failed_write_surfaces_in_the_training_loop(tmp_path: Path) -> None:
    directory = tmp_path / "vanishing"
    writer = hooks(directory)
    directory.rmdir()  # the volume went away: the background write must not fail silently
    writer.save({"step": 3, "model": {}}, 3)
    with pytest.raises(FileNotFoundError):
        writer.finish({"step": 3, "model": {}}, 3)


def test_sigterm_asks_to_stop_and_the_handler_is_restored(tmp_path: Path) -> None:
    previous = signal.getsignal(signal.SIGTERM)
    writer = LocalFileHooks(tmp_path, every=3, log_every=0)
    assert not writer.should_stop()
    os.kill(os.getpid(), signal.SIGTERM)
    assert writer.should_stop()
    writer.finish({"step": 0, "model": {}}, 0)
    assert signal.getsignal(signal.SIGTERM) == previous


def test_stopped_and_resumed_loop_is_bit_exact(tmp_path: Path) -> None:
    reference_trainer = Trainer(TINY)
    reference = run_training(reference_trainer, hooks(tmp_path / "ref"), 10)
    assert not reference.stopped and reference.step == 10

    first = run_training(Trainer(TINY), hooks(tmp_path / "run"), 10, stop_at=4)
    assert first.stopped and first.step == 4
    assert [step for step, _ in list_checkpoints(tmp_path / "run")] == [4, 3]

    resumed_trainer = Trainer(TINY)
    resumed = run_training(resumed_trainer, hooks(tmp_path / "run"), 10)
    assert resumed.first_step == 4 and resumed.step == 10
    assert [step for step, _ in resumed.losses] == list(range(5, 11))
    assert params_sha256(resumed_trainer.model) == params_sha256(reference_trainer.model)


def test_stop_request_saves_and_leaves_early(tmp_path: Path) -> None:
    writer = hooks(tmp_path, every=0)
    writer.request_stop()
    result = run_training(Trainer(TINY), writer, 10)
    assert result.stopped and result.step == 1
    assert [step for step, _ in list_checkpoints(tmp_path)] == [1]


def test_stop_at_an_already_reached_step_trains_nothing(tmp_path: Path) -> None:
    run_training(Trainer(TINY), hooks(tmp_path), 10, stop_at=3)
    again = run_training(Trainer(TINY), hooks(tmp_path), 10, stop_at=2)
    assert again.stopped and again.step == 3 and again.losses == []
