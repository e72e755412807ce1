"""A warm (in-process) restart of an FSDP2 job keeps each rank's shard: two real ranks (gloo,
``fully_shard`` on a mesh, AdamW) restore their local shards from host memory into their live
DTensors, bit for bit, without building a full tensor; a rank started in another's place
reads the node's segments, and a corrupted segment is caught and read from the volume
(``fsdp_warm_job.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from goodput.checkpoint.engine.node_segments import segment_prefix
from tests.ckpt.rank_procs import run_ranks_of

pytestmark = pytest.mark.slow

JOB = Path(__file__).with_name("fsdp_warm_job.py")
WORLD = 2


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    base = tmp_path_factory.mktemp("warm-sharded")
    root, out = base / "ckpt", base / "out"
    root.mkdir()
    out.mkdir()
    run_ranks_of(JOB, [str(root), str(out)], WORLD, out, timeout_s=300)
    # every rank's engines closed: no segment of this job is left in /dev/shm
    assert not list(Path("/dev/shm").glob(segment_prefix(root) + "*"))
    return [json.loads((out / f"result-{rank}.json").read_text()) for rank in range(WORLD)]


def test_the_warm_restore_holds_each_ranks_shard_not_the_full_tensor(
    results: list[dict[str, Any]],
) -> None:
    for result in results:
        assert result["tier"] == "host" and result["step"] == 3
        assert result["moved_before_restore"]  # the live state had trained past step 3
        assert result["global_shape"] == [256, 64] and result["restored_is_dtensor"]
        assert result["restored_local_shape"] == [128, 64] == result["model_local_shape"]
        assert result["same_objects"]  # restored into the live DTensors, in place


def test_the_restored_shards_are_bit_identical_to_the_saved_ones(
    results: list[dict[str, Any]],
) -> None:
    for result in results:
        assert result["mismatches"] == [] and result["after_set_state_dict"] == []


def test_the_restore_takes_no_consolidated_copy_and_reads_no_volume(
    results: list[dict[str, Any]],
) -> None:
    """The engine's accounting: every byte from host memory, exactly the rank's shards (and
    rank 0's plain tensors); the peak memory the restore took stays far below one copy of
    the rank's shards (a consolidated restore would take twice the shards at least)."""
    for result in results:
        own = result["own"]
        assert own["mismatches"] == [] and own["volume_bytes"] == 0
        assert own["host_bytes"] == result["shard_bytes"]
        assert result["restore_peak_bytes"] < result["shard_bytes"] // 4, result


def test_a_replacement_rank_reads_its_shards_from_the_nodes_segments(
    results: list[dict[str, Any]],
) -> None:
    for result in results:
        replacement = result["replacement"]
        assert replacement["mismatches"] == [] and replacement["volume_bytes"] == 0
        assert replacement["host_bytes"] == result["shard_bytes"]


def test_a_corrupt_segment_is_caught_and_read_from_the_volume(
    results: list[dict[str, Any]],
) -> None:
    corrupt = results[1]["corrupt_segment"]
    assert corrupt["mismatches"] == []  # still bit-exact
    assert 0 < corrupt["volume_bytes"] <= 1 << 20  # the bad block's read alone, from the volume
    assert corrupt["host_bytes"] + corrupt["volume_bytes"] == results[1]["shard_bytes"]
