"""Restore from host memory: the bytes of the engine's buffer, verified against the manifest."""

from __future__ import annotations

from pathlib import Path

import torch

from goodput.checkpoint.engine import CheckpointEngine
from goodput.checkpoint.engine.host_restore import HostRestore, restore_from_host

from .helpers import assert_bit_exact, make_state


def test_a_persisted_snapshot_restores_bit_exact_from_memory_into_live_tensors(
    tmp_path: Path,
) -> None:
    state = make_state(1)
    with CheckpointEngine(tmp_path) as engine:
        assert engine.save(state, 5).wait().ok
        live = make_state(2)  # the training state moved on since the save
        weight = live["model"]["layer1.weight"]
        outcome = restore_from_host(engine, 5, live)
        assert isinstance(outcome, HostRestore) and outcome.step == 5 and outcome.bytes > 0
        assert_bit_exact(state, outcome.state)
        assert outcome.state["model"]["layer1.weight"] is weight  # loaded in place


def test_what_the_live_state_has_and_the_checkpoint_has_not_does_not_survive(
    tmp_path: Path,
) -> None:
    """A survivor's optimizer holds moments of steps after the checkpoint (here: of a state
    saved before the first step, with none): the restored state must not keep them."""
    saved = {"w": torch.ones(4), "optimizer": {"state": {}}}
    with CheckpointEngine(tmp_path) as engine:
        assert engine.save(saved, 0).wait().ok
        live = {"w": torch.zeros(4), "optimizer": {"state": {0: {"exp_avg": torch.ones(4)}}}}
        outcome = restore_from_host(engine, 0, live)
        assert isinstance(outcome, HostRestore)
        assert outcome.state["optimizer"] == {"state": {}}
        assert outcome.state["w"] is live["w"] and torch.equal(live["w"], torch.ones(4))


def test_a_buffer_that_differs_from_the_committed_checksums_is_refused(tmp_path: Path) -> None:
    with CheckpointEngine(tmp_path) as engine:
        assert engine.save(make_state(1), 5).wait().ok
        snapshot = engine.host_snapshot(5)
        assert snapshot is not None
        snapshot[1][100] ^= 0xFF  # a flipped byte in host memory
        outcome = restore_from_host(engine, 5, make_state(2))
        assert isinstance(outcome, str) and "does not match the committed checksum" in outcome
        step, restored = engine.restore(step=5)  # the volume still has it right
        assert step == 5
        assert_bit_exact(make_state(1), restored)


def test_only_the_newest_snapshot_is_in_memory(tmp_path: Path) -> None:
    with CheckpointEngine(tmp_path) as engine:
        assert engine.save(make_state(1), 5).wait().ok
        assert engine.save(make_state(1), 6).wait().ok
        assert restore_from_host(engine, 5, make_state(2)) == "step 5 is no longer in host memory"


def test_a_step_whose_commit_is_gone_is_not_restored_from_memory(tmp_path: Path) -> None:
    with CheckpointEngine(tmp_path, keep_last=0) as engine:
        assert engine.save(make_state(1), 5).wait().ok
        manifest = next(tmp_path.glob("step-*/manifest.json"))
        manifest.unlink()
        outcome = restore_from_host(engine, 5, {"x": torch.zeros(1)})
        assert isinstance(outcome, str) and "manifest" in outcome


def test_an_overlapped_snapshot_is_served_only_once_its_copy_completed(tmp_path: Path) -> None:
    """With ``overlap`` the copy into the buffer runs on after ``save``: the buffer is handed
    out once the copy is done, holding exactly the state of the step."""
    state = {"w": torch.arange(4_000_000, dtype=torch.float32)}
    with CheckpointEngine(tmp_path) as engine:
        handle = engine.save(state, 3, overlap=True)
        snapshot = engine.host_snapshot(3)
        assert snapshot is not None and handle.copy is not None and handle.copy.done()
        plan, data = snapshot
        assert torch.equal(data[: plan.slice_bytes].view(torch.float32), state["w"])
        assert handle.wait().ok
        outcome = restore_from_host(engine, 3, {"w": torch.zeros(4_000_000)})
        assert isinstance(outcome, HostRestore)
        assert torch.equal(outcome.state["w"], state["w"])
