"""torch.distributed.checkpoint through goodput storage: commit, verification, resharding."""

from __future__ import annotations

import os
import pickle
import sys
import threading
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
import torch.multiprocessing as mp
import xxhash
from torch.distributed.checkpoint import DefaultLoadPlanner
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.planner import ReadItem

from goodput.checkpoint.engine import (
    NoCheckpointError,
    dcp_storage,
    list_checkpoints,
    read_manifest,
    verify_files,
)
from goodput.checkpoint.engine.dcp_files import DIGEST_SUFFIX
from goodput.checkpoint.engine.dcp_storage import (
    GoodputStorageReader,
    GoodputStorageWriter,
    load_verified,
)
from goodput.checkpoint.format import write_manifest

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


def _flip_bytes(checkpoint: Path) -> str:
    """Corrupt a data file in place (same size: only its digest can tell)."""
    data = next(e.name for e in read_manifest(checkpoint).files if e.name.endswith(".distcp"))
    _flip_bytes_of(checkpoint / data)
    return data


def test_a_load_fails_on_a_bad_byte_and_load_verified_falls_back(tmp_path: Path) -> None:
    for step in (1, 2):
        dcp.save(_state(step), storage_writer=GoodputStorageWriter(tmp_path, step))
    data = _flip_bytes(tmp_path / "step-0000000002")
    reader = GoodputStorageReader(tmp_path)
    assert reader.step == 2  # complete: its bytes are checked while dcp.load reads them
    with pytest.raises(CheckpointException, match=rf"step 2: {data}: xxh3_128 mismatch"):
        dcp.load(_zeros(), storage_reader=reader)
    target = _zeros()
    loaded = load_verified(target, tmp_path)
    assert loaded.step == 1 and [f.step for f in loaded.fallbacks] == [2]
    assert "xxh3_128 mismatch" in loaded.fallbacks[0].reason
    assert torch.equal(target["model"]["w"], _state(1)["model"]["w"])
    assert target["step"] == 1
    _flip_bytes(tmp_path / "step-0000000001")
    with pytest.raises(NoCheckpointError, match=r"step 1: .*xxh3_128 mismatch"):
        load_verified(_zeros(), tmp_path)


def test_a_file_dcp_cannot_parse_is_reported_corrupt_and_load_verified_falls_back(
    tmp_path: Path,
) -> None:
    """Its first bytes (a zip signature) garbled: DCP's read raises before any digest."""
    for step in (1, 2):
        dcp.save(_state(step), storage_writer=GoodputStorageWriter(tmp_path, step))
    checkpoint = tmp_path / "step-0000000002"
    data = next(e for e in read_manifest(checkpoint).files if e.name.endswith(".distcp"))
    with open(checkpoint / data.name, "r+b") as handle:
        handle.write(b"\xff" * 4)
    with pytest.raises(CheckpointException, match=rf"{data.name}: xxh3_128 mismatch"):
        dcp.load(_zeros(), storage_reader=GoodputStorageReader(tmp_path))
    target = _zeros()
    assert load_verified(target, tmp_path).step == 1
    assert torch.equal(target["model"]["w"], _state(1)["model"]["w"])


def test_the_reader_skips_an_incomplete_checkpoint(tmp_path: Path) -> None:
    for step in (1, 2, 3):  # all three kept: the reader falls back from 3 past 2 to 1
        dcp.save(_state(step), storage_writer=GoodputStorageWriter(tmp_path, step, keep_last=3))
    data = next(
        e.name
        for e in read_manifest(tmp_path / "step-0000000003").files
        if e.name.endswith(".distcp")
    )
    os.truncate(tmp_path / "step-0000000003" / data, 10)
    _flip_bytes_in_metadata(tmp_path / "step-0000000002")
    target = _zeros()
    reader = GoodputStorageReader(tmp_path)
    dcp.load(target, storage_reader=reader)
    assert reader.step == 1 and [f.step for f in reader.fallbacks] == [3, 2]
    assert "size 10 !=" in reader.fallbacks[0].reason
    assert reader.fallbacks[1].reason == ".metadata: xxh3_128 mismatch"
    assert torch.equal(target["model"]["w"], _state(1)["model"]["w"])
    (tmp_path / "step-0000000001" / ".metadata").unlink()
    with pytest.raises(NoCheckpointError, match=r"step 1: \.metadata: missing"):
        GoodputStorageReader(tmp_path)


def _flip_bytes_in_metadata(checkpoint: Path) -> None:
    """DCP unpickles .metadata before reading anything: the reader checks it first."""
    metadata = checkpoint / ".metadata"
    raw = bytearray(metadata.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    metadata.write_bytes(bytes(raw))


def test_retention_keeps_last_k(tmp_path: Path) -> None:
    for step in range(1, 5):
        dcp.save(_state(step), storage_writer=GoodputStorageWriter(tmp_path, step, keep_last=2))
    assert [info.step for info in list_checkpoints(tmp_path)] == [4, 3]


def _exit_before_finalization() -> None:
    """A rank that passed leaves without the interpreter's finalization. Its DeviceMesh and
    DTensors still hold the gloo group after ``destroy_process_group``; a gloo thread that
    frees their work's tensors during finalization takes the GIL of an interpreter being torn
    down, is unwound through C++ code that cannot be, and aborts the rank ("terminate called
    without an active exception": the clean-clone run ci13, once)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


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
    _exit_before_finalization()


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


def test_each_file_is_hashed_by_the_process_that_wrote_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commit takes the digests the writers left; it reads back only DCP's .metadata."""
    read_back: list[str] = []
    rehash = dcp_storage.file_xxh3_128
    monkeypatch.setattr(
        dcp_storage, "file_xxh3_128", lambda path: read_back.append(Path(path).name) or rehash(path)
    )
    dcp.save(_state(4), storage_writer=GoodputStorageWriter(tmp_path, 4, thread_count=2))
    checkpoint = tmp_path / "step-0000000004"
    assert read_back == [".metadata"]
    assert len(read_manifest(checkpoint).files) == 3  # two data files and .metadata
    assert verify_files(checkpoint) == []
    assert not list(checkpoint.glob(f"*{DIGEST_SUFFIX}"))


def test_the_writer_pickles_for_async_saves_checkpoint_process(tmp_path: Path) -> None:
    writer = pickle.loads(pickle.dumps(GoodputStorageWriter(tmp_path, 5)))
    dcp.save(_state(5), storage_writer=writer)
    assert verify_files(tmp_path / "step-0000000005") == []


class _MeetingPlanner(DefaultLoadPlanner):
    """Each reading thread's first tensor waits for a second thread: a serial read times out."""

    def __init__(self) -> None:
        super().__init__()
        self._meeting = threading.Barrier(2, timeout=30)
        self._met: set[int] = set()

    def resolve_tensor(self, read_item: ReadItem) -> torch.Tensor:
        if threading.get_ident() not in self._met:
            self._met.add(threading.get_ident())
            self._meeting.wait()
        return super().resolve_tensor(read_item)


def test_the_reader_reads_files_at_once(tmp_path: Path) -> None:
    dcp.save(_state(6), storage_writer=GoodputStorageWriter(tmp_path, 6, thread_count=2))
    target = _zeros()
    dcp.load(target, storage_reader=GoodputStorageReader(tmp_path), planner=_MeetingPlanner())
    assert torch.equal(target["model"]["w"], _state(6)["model"]["w"])
    assert torch.equal(target["model"]["b"], _state(6)["model"]["b"])


def _load_after_rank_1s_file_rots(rank: int, world: int, root: str, rendezvous: str) -> None:
    """Two ranks save a Shard(0) tensor at steps 1 and 2; rank 1's file of step 2 rots; both
    load it back sharded, so only rank 1 reads (and hashes) the bad file."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    warnings.filterwarnings("ignore")
    torch.distributed.init_process_group(
        "gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world
    )
    try:
        mesh = init_device_mesh("cpu", (world,))
        for step in (1, 2):
            full = _state(step)["model"]["w"]
            state = {"w": distribute_tensor(full, mesh, [Shard(0)])}
            dcp.save(state, storage_writer=GoodputStorageWriter(root, step))
        if rank == 0:
            _flip_bytes_of(Path(root) / "step-0000000002" / "__1_0.distcp")
        torch.distributed.barrier()
        target = {"w": distribute_tensor(torch.zeros(64, 16), mesh, [Shard(0)])}
        loaded = load_verified(target, root)
        expected = _state(1)["model"]["w"].chunk(world)[rank]
        assert loaded.step == 1 and [f.step for f in loaded.fallbacks] == [2]
        assert torch.equal(target["w"].to_local(), expected)
        torch.distributed.barrier()  # neither rank tears gloo down under the other's last read
    finally:
        torch.distributed.destroy_process_group()
    _exit_before_finalization()


def _flip_bytes_of(path: Path) -> None:
    with open(path, "r+b") as handle:
        handle.seek(50)
        handle.write(b"\xff\xfe")


def test_every_rank_falls_back_when_one_ranks_file_is_bad(tmp_path: Path) -> None:
    mp.start_processes(
        _load_after_rank_1s_file_rots,
        args=(2, str(tmp_path / "ckpt"), str(tmp_path / "rendezvous")),
        nprocs=2,
        join=True,
        start_method="spawn",
    )


class _Exploit:
    """Unpickling this runs ``touch <path>``: the marker proves whether code ran."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {self.path}",))


def test_a_forged_metadata_pickle_never_runs_and_load_verified_falls_back(tmp_path: Path) -> None:
    """A forger replaces step 2's .metadata and re-seals the manifest with its digest (no
    key here): the reader unpickles DCP's metadata types only, so the step is corrupt."""
    for step in (1, 2):
        dcp.save(_state(step), storage_writer=GoodputStorageWriter(tmp_path, step))
    marker = tmp_path / "code-ran"
    newest = tmp_path / "step-0000000002"
    forged = pickle.dumps(_Exploit(marker))
    (newest / ".metadata").write_bytes(forged)
    manifest = read_manifest(newest)
    entry = next(e for e in manifest.files if e.name == ".metadata")
    entry.size, entry.xxh3_128 = len(forged), xxhash.xxh3_128_hexdigest(forged)
    write_manifest(newest, manifest)
    target = _zeros()
    loaded = load_verified(target, tmp_path)
    assert loaded.step == 1 and [f.step for f in loaded.fallbacks] == [2]
    assert "posix.system, not DCP metadata" in loaded.fallbacks[0].reason
    assert torch.equal(target["model"]["w"], _state(1)["model"]["w"])
    # a checkpoint of DCP's own writer (no manifest, no digest) is read as data too
    plain = tmp_path / "plain"
    dcp.save(_state(3), storage_writer=dcp.FileSystemWriter(plain))
    (plain / ".metadata").write_bytes(forged)
    with pytest.raises(CheckpointException, match="not DCP metadata"):
        dcp.load(_zeros(), storage_reader=GoodputStorageReader(plain))
    assert not marker.exists()
