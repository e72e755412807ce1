"""torch.distributed.checkpoint through goodput storage: commit, verification, resharding."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp

from goodput.ckpt import NoCheckpointError, list_checkpoints, read_manifest, verify_files
from goodput.ckpt.dcp_storage import GoodputStorageReader, GoodputStorageWriter

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _state(seed: int) -> dict:
    generator = torch.Generator().manual_seed(seed)
    return {
        "model": {"w": torch.randn(64, 16, generator=generator), "b": torch.arange(16) + seed},
        "step": seed,
    }


def _zeros() -> dict:
    return {"model": {"w": torch.zeros(64, 16), "b": torch.zeros(16, dtype=torch.long)}, "step": 0}


def test_save_async_save_and_load(tmp_path: Path) -> None:
    dcp.save(_state(1), storage_writer=GoodputStorageWriter(tmp_path, 1))
    future = dcp.async_save(_state(2), storage_writer=GoodputStorageWriter(tmp_path, 2))
    future.result()
    assert [info.step for info in list_checkpoints(tmp_path)] == [2, 1]
    manifest = read_manifest(tmp_path / "step-0000000002")
    assert manifest.kind == "dcp" and ".metadata" in {entry.name for entry in manifest.files}
    assert verify_files(tmp_path / "step-0000000002") == []
    assert not [name for name in os.listdir(tmp_path) if name.startswith(".")]
    target = _zeros()
    reader = GoodputStorageReader(tmp_path)
    dcp.load(target, storage_reader=reader)
    assert reader.step == 2 and reader.fallbacks == ()
    assert torch.equal(target["model"]["w"], _state(2)["model"]["w"])
    assert torch.equal(target["model"]["b"], _state(2)["model"]["b"])
    assert target["step"] == 2


def test_reader_falls_back_past_a_corrupt_checkpoint(tmp_path: Path) -> None:
    for step in (1, 2):
        dcp.save(_state(step), storage_writer=GoodputStorageWriter(tmp_path, step))
    data = next(e.name for e in read_manifest(tmp_path / "step-0000000002").files if e.size > 100)
    with open(tmp_path / "step-0000000002" / data, "r+b") as handle:
        handle.seek(50)
        handle.write(b"\xff\xfe")
    target = _zeros()
    reader = GoodputStorageReader(tmp_path)
    dcp.load(target, storage_reader=reader)
    assert reader.step == 1 and [f.step for f in reader.fallbacks] == [2]
    assert torch.equal(target["model"]["w"], _state(1)["model"]["w"])
    (tmp_path / "step-0000000001" / ".metadata").unlink()
    with pytest.raises(NoCheckpointError, match=r"step 1: \.metadata: missing"):
        GoodputStorageReader(tmp_path)


def test_retention_keeps_last_k(tmp_path: Path) -> None:
    for step in range(1, 5):
        dcp.save(_state(step), storage_writer=GoodputStorageWriter(tmp_path, step, keep_last=2))
    assert [info.step for info in list_checkpoints(tmp_path)] == [4, 3]


def _save_sharded(rank: int, world: int, root: str, rendezvous: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    warnings.filterwarnings("ignore")
    torch.distributed.init_process_group(
        "gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world
    )
    try:
        mesh = init_device_mesh("cpu", (world,))
        full = _state(7)["model"]["w"]
        state = {
            "model": {"w": distribute_tensor(full, mesh, [Shard(0)]), "b": _state(7)["model"]["b"]},
            "step": 7,
        }
        dcp.save(state, storage_writer=GoodputStorageWriter(root, 7))
    finally:
        torch.distributed.destroy_process_group()


def test_checkpoint_from_two_ranks_loads_onto_one(tmp_path: Path) -> None:
    """Elastic scale-down: a tensor sharded over 2 ranks restores whole in 1 process."""
    root = tmp_path / "ckpt"
    mp.start_processes(
        _save_sharded,
        args=(2, str(root), str(tmp_path / "rendezvous")),
        nprocs=2,
        join=True,
        start_method="spawn",
    )
    manifest = read_manifest(root / "step-0000000007")
    assert {e.name for e in manifest.files} >= {"__0_0.distcp", "__1_0.distcp", ".metadata"}
    target = _zeros()
    dcp.load(target, storage_reader=GoodputStorageReader(root))
    assert torch.equal(target["model"]["w"], _state(7)["model"]["w"])
    assert torch.equal(target["model"]["b"], _state(7)["model"]["b"])
    assert target["step"] == 7


def test_reader_loads_a_checkpoint_written_by_dcps_own_writer(tmp_path: Path) -> None:
    plain = tmp_path / "dcp-own"
    dcp.save(_state(3), checkpoint_id=plain)
    target = _zeros()
    reader = GoodputStorageReader(plain)
    dcp.load(target, storage_reader=reader)
    assert reader.step is None and reader.fallbacks == ()
    assert torch.equal(target["model"]["w"], _state(3)["model"]["w"])
    assert target["step"] == 3
