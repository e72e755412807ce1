"""Restore from host memory when the ranks of a node each saved a slice (``dp_world`` > 1):
each survivor takes its slice from its own buffer and the other slices from the volume.

Real engines, one per rank, sharing one root as the ranks of a node share its volume."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
import torch

from goodput.checkpoint.engine import CheckpointEngine
from goodput.checkpoint.engine.host_restore import HostRestore, restore_from_host
from goodput.checkpoint.format import read_manifest, step_dir

from .helpers import assert_bit_exact, make_state

RANKS = 4  # ranks of one node: four slices, several data files each


@pytest.fixture
def node(tmp_path: Path) -> Iterator[list[CheckpointEngine]]:
    """One engine per rank of a node, each having saved its slice of step 5 (committed)."""
    with ExitStack() as stack:
        engines = [
            stack.enter_context(CheckpointEngine(tmp_path, min_file_bytes=4096))
            for _ in range(RANKS)
        ]
        handles = [
            engine.save(make_state(1, scale=8), 5, dp_rank=r, dp_world=RANKS)
            for r, engine in enumerate(engines)
        ]
        assert all(handle.wait().ok for handle in handles)
        yield engines


def _files_of(root: Path, dp_rank: int) -> list[Path]:
    manifest = read_manifest(step_dir(root, 5))
    return [step_dir(root, 5) / e.name for e in manifest.files if e.dp_rank == dp_rank]


def test_every_survivor_restores_bit_exact_with_its_own_slice_from_memory(
    node: list[CheckpointEngine],
) -> None:
    total = read_manifest(step_dir(node[0].root, 5)).stream_bytes
    for rank, engine in enumerate(node):
        live = make_state(2, scale=8)  # the survivor trained on past the checkpoint
        weight = live["model"]["layer1.weight"]
        outcome = restore_from_host(engine, 5, live)
        assert isinstance(outcome, HostRestore), f"rank {rank}: {outcome}"
        assert_bit_exact(make_state(1, scale=8), outcome.state)
        assert outcome.state["model"]["layer1.weight"] is weight  # loaded in place
        assert outcome.bytes == total
        assert 0 < outcome.host_bytes < total and outcome.volume_bytes == total - outcome.host_bytes
        assert outcome.host_bytes == sum(p.stat().st_size for p in _files_of(engine.root, rank))


def test_the_own_slice_is_not_read_from_the_volume(node: list[CheckpointEngine]) -> None:
    """Rank 1's own files are gone from the volume: it still restores, from its buffer; a
    rank for which those files are another's slice cannot."""
    for path in _files_of(node[1].root, 1):
        path.unlink()
    outcome = restore_from_host(node[1], 5, make_state(2, scale=8))
    assert isinstance(outcome, HostRestore)
    assert_bit_exact(make_state(1, scale=8), outcome.state)
    other = restore_from_host(node[2], 5, make_state(2, scale=8))
    assert isinstance(other, str) and "other slices on the volume" in other and "missing" in other


def test_a_slice_in_memory_that_differs_from_the_manifest_falls_back_to_the_volume(
    node: list[CheckpointEngine],
) -> None:
    snapshot = node[2].host_snapshot(5)
    assert snapshot is not None
    snapshot[1][7] ^= 0xFF  # a flipped byte in rank 2's host memory
    outcome = restore_from_host(node[2], 5, make_state(2, scale=8))
    assert isinstance(outcome, str) and "does not match the committed checksum" in outcome
    step, restored = node[2].restore(step=5)  # the volume still has it right
    assert step == 5
    assert_bit_exact(make_state(1, scale=8), restored)


def test_a_corrupt_slice_of_another_rank_on_the_volume_is_not_loaded(
    node: list[CheckpointEngine],
) -> None:
    victim = _files_of(node[0].root, 3)[0]
    data = bytearray(victim.read_bytes())
    data[0] ^= 0xFF
    victim.write_bytes(bytes(data))
    outcome = restore_from_host(node[0], 5, make_state(2, scale=8))
    assert isinstance(outcome, str) and "xxh3_128 mismatch" in outcome


def test_a_respawned_rank_has_no_buffer_and_reads_everything_from_the_volume(
    node: list[CheckpointEngine],
) -> None:
    with CheckpointEngine(node[0].root) as respawned:
        outcome = restore_from_host(respawned, 5, make_state(2, scale=8))
        assert outcome == "step 5 is no longer in host memory"
        step, restored = respawned.restore(step=5)
    assert step == 5
    assert_bit_exact(make_state(1, scale=8), restored)


def test_a_rank_whose_slice_is_empty_reads_the_volume(tmp_path: Path) -> None:
    """More ranks than the stream has pages: the last ones hold no byte in memory."""
    state = {"w": torch.arange(8.0)}
    with ExitStack() as stack:
        engines = [stack.enter_context(CheckpointEngine(tmp_path)) for _ in range(2)]
        handles = [e.save(state, 1, dp_rank=r, dp_world=2) for r, e in enumerate(engines)]
        assert all(handle.wait().ok for handle in handles)
        assert isinstance(restore_from_host(engines[0], 1, {"w": torch.zeros(8)}), HostRestore)
        outcome = restore_from_host(engines[1], 1, {"w": torch.zeros(8)})
        assert isinstance(outcome, str) and "holds none" in outcome
