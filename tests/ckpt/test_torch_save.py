"""The baseline checkpointer: blocking torch.save by one writer, newest loadable file restored."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from goodput.checkpoint.engine import NoCheckpointError
from goodput.checkpoint.engine import events as ckpt_events
from goodput.checkpoint.engine.torch_save import TorchSaveCheckpointer, checkpoint_path
from goodput.checkpoint.format import write_clean_record


def _state(value: float) -> dict:
    return {"model": {"w": torch.full((256, 256), value)}, "step": int(value), "name": "gpt"}


def test_saves_block_until_durable_and_restore_the_newest(tmp_path: Path) -> None:
    seen: list[ckpt_events.CheckpointEvent] = []
    writer = TorchSaveCheckpointer(tmp_path, writer=True, keep_last=2, listener=seen.append)
    reader = TorchSaveCheckpointer(tmp_path, writer=False)
    for step in (10, 20, 30):
        writer.save(_state(step), step)
        assert checkpoint_path(tmp_path, step).is_file()  # on disk when save returns
    reader.save(_state(99), 40)  # not the writer: writes nothing
    assert writer.steps() == [20, 30]  # retention keeps the newest two
    step, state = reader.restore()
    assert step == 30 and torch.equal(state["model"]["w"], torch.full((256, 256), 30.0))
    assert reader.restore(step=25)[0] == 20
    snapshots = [e for e in seen if isinstance(e, ckpt_events.CheckpointSaved)]
    persisted = [e for e in seen if isinstance(e, ckpt_events.CheckpointPersisted)]
    # the whole write is a stall: training waited for it
    assert [e.step for e in snapshots] == [e.step for e in persisted] == [10, 20, 30]
    assert all(s.stall_s == p.duration_s > 0 for s, p in zip(snapshots, persisted, strict=True))


def test_the_known_clean_file_is_kept_beside_the_newest(tmp_path: Path) -> None:
    """The ranks agreed at step 25: a rollback restores step 20, which retention keeps."""
    writer = TorchSaveCheckpointer(tmp_path, writer=True, keep_last=1)
    write_clean_record(tmp_path, 25)
    for step in (10, 20, 30, 40):
        writer.save(_state(step), step)
    assert writer.steps() == [20, 40]


def test_a_corrupt_newest_file_falls_back_and_nothing_loadable_is_a_clear_error(
    tmp_path: Path,
) -> None:
    seen: list[ckpt_events.CheckpointEvent] = []
    ckpt = TorchSaveCheckpointer(tmp_path, writer=True, listener=seen.append)
    ckpt.save(_state(1), 1)
    ckpt.save(_state(2), 2)
    newest = checkpoint_path(tmp_path, 2)
    newest.write_bytes(newest.read_bytes()[:100])  # truncated
    step, _ = ckpt.restore()
    assert step == 1
    restored = [e for e in seen if isinstance(e, ckpt_events.CheckpointRestored)][-1]
    assert [f.step for f in restored.fallbacks] == [2]
    checkpoint_path(tmp_path, 1).write_bytes(b"not a checkpoint")
    with pytest.raises(NoCheckpointError, match=r"no loadable torch\.save checkpoint"):
        ckpt.restore()
    assert isinstance(seen[-1], ckpt_events.CheckpointRestoreFailed)
    assert TorchSaveCheckpointer(tmp_path / "empty", writer=False).latest_complete_step() is None
