"""CheckpointEngine against real files: round trips, layout contract, events, async rules."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import torch

from goodput.checkpoint.engine import (
    CheckpointEngine,
    StateMismatchError,
    list_checkpoints,
    read_manifest,
    verify_files,
)
from goodput.checkpoint.engine.events import (
    CheckpointDropped,
    CheckpointFailed,
    CheckpointPersisted,
    CheckpointRestored,
    CheckpointRetentionDeleted,
    CheckpointSaved,
)
from goodput.checkpoint.format import file_xxh3_128

from .helpers import assert_bit_exact, make_state


def test_round_trip_is_bit_exact_including_plain_values(tmp_path: Path) -> None:
    state = make_state(3)
    with CheckpointEngine(tmp_path) as engine:
        result = engine.save(state, 7).wait()
        assert result.ok and result.committed
        step, restored = engine.restore()
    assert step == 7
    assert_bit_exact(state, restored)


def test_restore_into_existing_state_loads_in_place(tmp_path: Path) -> None:
    saved = make_state(1)
    target = make_state(2)
    weight = target["model"]["layer1.weight"]
    transposed = torch.zeros(32, 64).t()  # non-contiguous target of the right shape
    target["model"]["layer2.weight"] = transposed
    with CheckpointEngine(tmp_path) as engine:
        engine.save(saved, 1).wait()
        step, loaded = engine.restore(into=target)
    assert step == 1 and loaded is target
    assert target["model"]["layer1.weight"] is weight, "tensor object must be reused"
    assert target["model"]["layer2.weight"] is transposed
    assert_bit_exact(saved, target)


def test_restore_into_mismatched_shape_is_a_clear_error(tmp_path: Path) -> None:
    with CheckpointEngine(tmp_path) as engine:
        engine.save({"w": torch.ones(4, 4)}, 1).wait()
        with pytest.raises(StateMismatchError, match="checkpoint has float32"):
            engine.restore(into={"w": torch.ones(2, 8)})


def test_layout_and_manifest_contract(tmp_path: Path) -> None:
    state = make_state(4, scale=8)
    with CheckpointEngine(tmp_path, writer_threads=2, min_file_bytes=4096) as engine:
        engine.save(state, 12, metadata={"job": "j1"}).wait()
    directory = tmp_path / "step-0000000012"
    assert sorted(os.listdir(tmp_path)) == ["step-0000000012"], "no temp dirs left behind"
    manifest = read_manifest(directory)
    assert manifest.format == "goodput-ckpt/1" and manifest.step == 12
    assert manifest.metadata == {"job": "j1"}
    assert len(manifest.files) > 1, "several data files for parallel IO"
    listed = {entry.name for entry in manifest.files}
    assert listed | {"manifest.json"} == set(os.listdir(directory))
    for entry in manifest.files:
        path = directory / entry.name
        assert (path.stat().st_size, file_xxh3_128(path)) == (entry.size, entry.xxh3_128)
    assert verify_files(directory) == []


def test_events_and_retention(tmp_path: Path) -> None:
    events: list[object] = []
    with CheckpointEngine(tmp_path, keep_last=2, listener=events.append) as engine:
        for step in (10, 20, 30, 40):
            engine.save(make_state(step), step).wait()
        engine.wait_until_idle()
        assert engine.latest_complete_step() == 40
        engine.restore()
    assert [info.step for info in list_checkpoints(tmp_path)] == [40, 30]
    kinds = [type(event) for event in events]
    assert kinds.count(CheckpointSaved) == 4
    assert kinds.count(CheckpointPersisted) == 4
    deleted = [event.step for event in events if isinstance(event, CheckpointRetentionDeleted)]
    assert deleted == [10, 20]
    persisted = next(event for event in events if isinstance(event, CheckpointPersisted))
    assert persisted.bytes > 0 and persisted.gbps > 0 and persisted.committed
    restored = next(event for event in events if isinstance(event, CheckpointRestored))
    assert restored.step == 40 and restored.fallbacks == ()


class _BlockingListener:
    """Holds the persist worker inside the 'persisted' callback until released."""

    def __init__(self, block_step: int) -> None:
        self.block_step = block_step
        self.entered = threading.Event()
        self.release = threading.Event()
        self.events: list[object] = []

    def __call__(self, event: object) -> None:
        self.events.append(event)
        if isinstance(event, CheckpointPersisted) and event.step == self.block_step:
            self.entered.set()
            self.release.wait(30)


def test_newest_snapshot_wins_when_persisting_lags(tmp_path: Path) -> None:
    listener = _BlockingListener(block_step=1)
    with CheckpointEngine(tmp_path, max_inflight=2, listener=listener) as engine:
        first = engine.save(make_state(1), 1)
        assert listener.entered.wait(30)
        second = engine.save(make_state(2), 2)  # waits in the second slot
        third = engine.save(make_state(3), 3)  # takes over that slot: 2 is dropped
        listener.release.set()
        assert first.wait().ok
        assert second.wait().status == "dropped"
        assert third.wait().ok
        step, restored = engine.restore()
    assert step == 3
    assert_bit_exact(make_state(3), restored)
    dropped = [e for e in listener.events if isinstance(e, CheckpointDropped)]
    assert [(e.step, e.superseded_by) for e in dropped] == [(2, 3)]


def test_memory_budget_limits_snapshots_in_flight(tmp_path: Path) -> None:
    state = make_state(1)
    listener = _BlockingListener(block_step=1)
    state_bytes = sum(t.numel() * t.element_size() for t in state["model"].values())
    engine = CheckpointEngine(
        tmp_path, max_inflight=3, memory_budget_bytes=state_bytes, listener=listener
    )
    try:
        engine.save(state, 1)
        assert listener.entered.wait(30)
        second: list[object] = []
        saver = threading.Thread(target=lambda: second.append(engine.save(state, 2)))
        saver.start()
        saver.join(0.5)
        assert saver.is_alive(), "with room for one snapshot, save 2 waits for the buffer"
        listener.release.set()
        saver.join(30)
        assert second and second[0].wait().ok
    finally:
        listener.release.set()
        engine.close()


def test_failed_save_is_an_event_and_training_goes_on(tmp_path: Path) -> None:
    root = tmp_path / "not-a-directory"
    root.write_text("a file where the checkpoint root should be")
    events: list[object] = []
    with CheckpointEngine(root, listener=events.append) as engine:
        result = engine.save(make_state(1), 1).wait()
    assert result.status == "failed" and "Error" in (result.error or "")
    failed = [e for e in events if isinstance(e, CheckpointFailed)]
    assert len(failed) == 1 and failed[0].step == 1


def test_resaving_a_step_replaces_it_atomically(tmp_path: Path) -> None:
    with CheckpointEngine(tmp_path) as engine:
        engine.save(make_state(1), 5).wait()
        engine.save(make_state(2), 5).wait()
        step, restored = engine.restore()
    assert step == 5
    assert_bit_exact(make_state(2), restored)
    assert sorted(os.listdir(tmp_path)) == ["step-0000000005"]


def test_data_parallel_replicas_each_write_a_slice(tmp_path: Path) -> None:
    state = make_state(9, scale=16)
    events: list[object] = []
    engines = [
        CheckpointEngine(tmp_path, min_file_bytes=4096, listener=events.append) for _ in range(2)
    ]
    try:
        handles = [engine.save(state, 3, dp_rank=r, dp_world=2) for r, engine in enumerate(engines)]
        results = [handle.wait() for handle in handles]
    finally:
        for engine in engines:
            engine.close()
    assert all(result.ok for result in results)
    assert [result.committed for result in results] == [True, False]
    snapshots = [e for e in events if isinstance(e, CheckpointSaved)]
    total = read_manifest(tmp_path / "step-0000000003").stream_bytes
    assert all(e.bytes < total * 0.6 for e in snapshots), "each replica copies only its half"
    manifest = read_manifest(tmp_path / "step-0000000003")
    assert {entry.dp_rank for entry in manifest.files} == {0, 1}
    assert verify_files(tmp_path / "step-0000000003") == []
    with CheckpointEngine(tmp_path) as reader:
        step, restored = reader.restore()
    assert step == 3
    assert_bit_exact(state, restored)


def test_data_parallel_layout_mismatch_fails_the_save(tmp_path: Path) -> None:
    events: list[object] = []
    rank0 = CheckpointEngine(tmp_path, dp_commit_timeout_s=5, listener=events.append)
    rank1 = CheckpointEngine(tmp_path)
    try:
        rank1.save({"w": torch.ones(10)}, 1, dp_rank=1, dp_world=2).wait()
        result = rank0.save({"w": torch.ones(12)}, 1, dp_rank=0, dp_world=2).wait()
    finally:
        rank0.close()
        rank1.close()
    assert result.status == "failed" and "different state layout" in (result.error or "")
    assert list_checkpoints(tmp_path) == []


def test_prepare_allocates_the_buffer_the_saves_then_reuse(tmp_path: Path) -> None:
    state = make_state(5)
    with CheckpointEngine(tmp_path) as engine:
        engine.prepare(state)
        prepared = engine._slots[0].buffer  # white-box: the one reused host buffer
        assert prepared is not None
        for step in (1, 2):
            assert engine.save(make_state(step), step).wait().ok
        assert len(engine._slots) == 1 and engine._slots[0].buffer is prepared
        step, restored = engine.restore()
    assert step == 2
    assert_bit_exact(make_state(2), restored)
