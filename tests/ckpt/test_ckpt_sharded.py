"""FSDP2 state through the engine: saved on 2 ranks, restored on 3 and on 1, bit for bit.

Real torch.distributed on CPU: gloo, ``init_device_mesh("cpu")``, ``fully_shard`` and AdamW
(``fsdp_job.py``, one process per rank). The save goes through the shim's normal path
(``TrainerShim.save``, local ranks sharing the node's root); restores go through the engine
and the shim.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import msgspec
import pytest
import torch
import xxhash

from goodput.checkpoint.engine import NoCheckpointError, restore_checkpoint
from goodput.checkpoint.engine.events import CheckpointRestored
from goodput.checkpoint.engine.fileio import CorruptCheckpointError
from goodput.checkpoint.engine.sharded_load import load_sharded
from goodput.checkpoint.format import (
    KIND_SHARDED,
    read_manifest,
    step_dir,
    verify_files,
    write_manifest,
)
from goodput.checkpoint.format.sharded import ShardRecord, encode_record, shard_record_name
from tests.ckpt.rank_procs import run_ranks_of

pytestmark = pytest.mark.slow

JOB = Path(__file__).with_name("fsdp_job.py")
STEP = 3


def run_ranks(world: int, phase: str, root: Path, out: Path, via: str) -> None:
    run_ranks_of(JOB, [phase, str(root), str(out), via], world, out, tag=f"{phase}-{world}")


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A step saved by 2 FSDP2 ranks through the shim, and the full tensors it holds."""
    base = tmp_path_factory.mktemp("sharded")
    root, out = base / "ckpt", base / "out"
    root.mkdir()
    out.mkdir()
    run_ranks(2, "save", root, out, "shim")
    return root, out


def results(out: Path, world: int) -> list[dict[str, Any]]:
    return [json.loads((out / f"result-{rank}.json").read_text()) for rank in range(world)]


def test_each_rank_saved_its_own_shards(saved: tuple[Path, Path]) -> None:
    root, _ = saved
    manifest = read_manifest(step_dir(root, STEP))
    assert manifest.kind == KIND_SHARDED and manifest.dp_world == 2
    names = {entry.name for entry in manifest.files}
    assert {shard_record_name(0), shard_record_name(1)} <= names
    assert {entry.dp_rank for entry in manifest.files} == {0, 1}
    # the manifest names the global tensors (33 rows), not a rank's shard (17 or 16)
    assert [33, 12] in [entry.shape for entry in manifest.tensors]
    assert verify_files(step_dir(root, STEP)) == []  # the tiers' whole-file check holds


@pytest.mark.parametrize(("world", "via"), [(3, "engine"), (1, "shim")])
def test_restored_on_another_world_size_bit_exact_and_trains(
    saved: tuple[Path, Path], tmp_path: Path, world: int, via: str
) -> None:
    root, out = saved
    here = tmp_path / "out"
    here.mkdir()
    shutil.copy(out / "expected.pt", here)
    run_ranks(world, "restore", root, here, via)
    got = results(here, world)
    assert [r["mismatches"] for r in got] == [[]] * world
    assert all(r["step"] == STEP and r["saved_step"] == STEP and r["moved"] for r in got)
    assert all(all(loss == loss and abs(loss) < 1e3 for loss in r["losses"]) for r in got)
    # 33 rows over the new world: torch.chunk's split (11 each on 3 ranks, all on 1)
    assert sum(r["local_rows"] for r in got) == 33
    if via == "engine":  # each rank reads its regions: together about the checkpoint, once
        read = [r["restored_bytes"][0] for r in got]
        manifest = read_manifest(step_dir(root, STEP))
        assert all(0 < b < manifest.total_bytes / 2 for b in read)
        assert sum(entry.nbytes for entry in manifest.tensors) <= sum(read)


def assert_full_tensors(root: Path, out: Path) -> None:
    """A restore with no template (one process, no process group) gives the full tensors."""
    expected = torch.load(out / "expected.pt", weights_only=True)
    step, state = restore_checkpoint(root)
    assert step == STEP and state["step"] == STEP
    for key, tensor in expected["model"].items():
        assert torch.equal(state["model"][key], tensor), key
    for key, moments in expected["optim"]["state"].items():
        for name, tensor in moments.items():
            assert torch.equal(state["optim"]["state"][key][name], tensor), (key, name)


def test_restore_without_a_template_consolidates_full_tensors(saved: tuple[Path, Path]) -> None:
    assert_full_tensors(*saved)
    # the restored event counts the bytes read (whole checksum blocks), not the files' total
    root, _ = saved
    events: list[object] = []
    restore_checkpoint(root, listener=events.append)
    (restored,) = [e for e in events if isinstance(e, CheckpointRestored)]
    manifest = read_manifest(step_dir(root, STEP))
    assert sum(entry.nbytes for entry in manifest.tensors) <= restored.bytes < manifest.total_bytes
    # again in reads of at most 100 bytes: many reads per shard, most not at its start
    root, out = saved
    expected = torch.load(out / "expected.pt", weights_only=True)
    path = step_dir(root, STEP)
    state, _ = load_sharded(path, read_manifest(path), max_read_bytes=100)
    for key, tensor in expected["model"].items():
        assert torch.equal(state["model"][key], tensor), key


def test_a_bad_block_or_a_missing_record_is_refused(
    saved: tuple[Path, Path], tmp_path: Path
) -> None:
    root = tmp_path / "ckpt"
    shutil.copytree(saved[0], root)
    path = step_dir(root, STEP)
    manifest = read_manifest(path)
    data = next(e for e in manifest.files if e.dp_rank == 1 and e.name.startswith("data-"))
    with open(path / data.name, "r+b") as file:
        file.seek(data.size // 2)
        byte = file.read(1)
        file.seek(data.size // 2)
        file.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(
        CorruptCheckpointError, match=r"rank 1, tensor \d+: block \d+ fails its checksum"
    ):
        load_sharded(path, manifest)
    (path / shard_record_name(1)).unlink()
    with pytest.raises(NoCheckpointError, match=r"shards-r00001\.json: missing"):
        restore_checkpoint(root)


def test_a_shard_whose_shape_does_not_match_its_bytes_is_refused_before_allocating(
    saved: tuple[Path, Path], tmp_path: Path
) -> None:
    """A forged record (re-sealed with the unkeyed digests anyone can compute) claims four
    times the rows for the same bytes: refused by the format's rule, not read as garbage."""
    root = tmp_path / "ckpt"
    shutil.copytree(saved[0], root)
    path = step_dir(root, STEP)
    manifest = read_manifest(path)
    name = shard_record_name(1)
    record = msgspec.json.decode((path / name).read_bytes(), type=ShardRecord)
    piece = next(p for p in record.pieces if p.nbytes)
    piece.shape = [piece.shape[0] * 4, *piece.shape[1:]]
    body = encode_record(record)
    (path / name).write_bytes(body)
    entry = next(e for e in manifest.files if e.name == name)
    entry.size, entry.xxh3_128 = len(body), xxhash.xxh3_128_hexdigest(body)
    write_manifest(path, manifest)
    with pytest.raises(NoCheckpointError, match=r"shards-r00001\.json: shard \d+: "):
        restore_checkpoint(root)


def test_a_root_per_rank_holds_an_hsdp_replica_but_not_an_fsdp2_shard(tmp_path: Path) -> None:
    # each rank alone in a root of its own, as ranks with a volume per node would be
    run_ranks(2, "save-own-roots", tmp_path, tmp_path, "engine")
    for rank, errors in enumerate(results(tmp_path, 2)):
        assert "saved shards cover" in errors["fsdp"]
        assert "do not hold the whole state" in errors["fsdp"]
        assert not list((tmp_path / f"fsdp-rank{rank}").glob("step-*"))
        assert errors["hsdp"] is None
        assert_full_tensors(tmp_path / f"hsdp-rank{rank}", tmp_path)
