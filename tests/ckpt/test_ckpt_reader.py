"""Restore reads straight into the tensors (buffered, or O_DIRECT where aligned), every byte checked."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from goodput.checkpoint.engine import CheckpointEngine, NoCheckpointError, read_manifest
from goodput.checkpoint.engine.buffers import byte_view
from goodput.checkpoint.engine.plan import IO_ALIGN, StreamIndex
from goodput.checkpoint.engine.reader import (
    MIN_DIRECT_BYTES,
    READ_CHUNK_BYTES,
    _landing,
    plan_segments,
)
from goodput.checkpoint.engine.restore import _aligned_like_file
from goodput.checkpoint.format import Manifest

from .helpers import assert_bit_exact


def _large_state(seed: int) -> dict[str, torch.Tensor]:
    """Tensors over MIN_DIRECT_BYTES at offsets that are not page multiples, and small ones."""
    generator = torch.Generator().manual_seed(seed)
    return {
        "bias": torch.randn(37, generator=generator),
        "w1": torch.randn(700, 1031, generator=generator),
        "half": torch.randn(999, 1033, generator=generator).to(torch.bfloat16),
        "w2": torch.randn(1203, 517, generator=generator),
    }


def _single_file(tmp_path: Path, direct_io: bool | str = "auto") -> CheckpointEngine:
    return CheckpointEngine(tmp_path, writer_threads=1, direct_io=direct_io, keep_last=0)


def _saved_once(tmp_path: Path, seed: int) -> tuple[dict[str, torch.Tensor], Manifest, StreamIndex]:
    """One save of a large state into one data file: the state, its manifest and index."""
    state = _large_state(seed)
    with _single_file(tmp_path) as engine:
        assert engine.save(state, 1).wait().ok
    manifest = read_manifest(next(tmp_path.glob("step-*")))
    return state, manifest, StreamIndex(manifest.tensors)


def test_restored_tensors_are_allocated_aligned_like_the_file_for_direct_reads(
    tmp_path: Path,
) -> None:
    state = _large_state(1)
    with _single_file(tmp_path, direct_io=True) as engine:
        assert engine.save(state, 1).wait().ok
        _, restored = engine.restore()
    assert_bit_exact(state, restored)
    manifest = read_manifest(next(tmp_path.glob("step-*")))
    for entry, name in zip(manifest.tensors, state, strict=True):
        if entry.nbytes >= MIN_DIRECT_BYTES:
            assert (restored[name].data_ptr() - entry.offset) % IO_ALIGN == 0


@pytest.mark.parametrize("direct_io", [True, "auto"])
def test_in_place_restore_of_unaligned_tensors_is_bit_exact(
    tmp_path: Path, direct_io: bool | str
) -> None:
    """O_DIRECT stages tensors aligned unlike the file; buffered reads take any alignment."""
    state = _large_state(2)
    with _single_file(tmp_path, direct_io) as engine:
        assert engine.save(state, 1).wait().ok
        into = {name: torch.zeros_like(tensor) for name, tensor in _large_state(3).items()}
        engine.restore(into=into)
    assert_bit_exact(state, into)


def test_segments_tile_the_file_and_direct_ones_are_aligned(tmp_path: Path) -> None:
    _, manifest, index = _saved_once(tmp_path, seed=4)
    targets: list[torch.Tensor | None] = [
        _aligned_like_file(e.shape, getattr(torch, e.dtype), e.offset).view(-1).view(torch.uint8)
        for e in manifest.tensors
    ]
    (entry,) = manifest.files
    segments = plan_segments(entry, index, targets, direct=True)
    assert sum(1 for s in segments if s.target is not None) == 3  # the three large tensors
    position = 0
    for segment in segments:
        assert segment.start == position and segment.size > 0
        position += segment.size
        if segment.target is not None:
            assert segment.start % IO_ALIGN == 0 and segment.size % IO_ALIGN == 0
            assert segment.target.data_ptr() % IO_ALIGN == 0
    assert position == entry.size
    assert all(s.target is None for s in plan_segments(entry, index, targets, direct=False))


@pytest.mark.parametrize("direct_io", [True, "auto"])
def test_a_bad_byte_falls_back(tmp_path: Path, direct_io: bool | str) -> None:
    older, newer = _large_state(5), _large_state(6)
    with _single_file(tmp_path, direct_io) as engine:
        assert engine.save(older, 1).wait().ok
        assert engine.save(newer, 2).wait().ok
        data = next((tmp_path / "step-0000000002").glob("data-*.bin"))
        with data.open("r+b") as handle:  # inside w1's page-aligned middle
            handle.seek(3 * IO_ALIGN + 5)
            byte = handle.read(1)
            handle.seek(3 * IO_ALIGN + 5)
            handle.write(bytes([byte[0] ^ 0xFF]))
        step, restored = engine.restore()
        assert step == 1
        assert_bit_exact(older, restored)
        (tmp_path / "step-0000000001" / "manifest.json").unlink()
        with pytest.raises(NoCheckpointError, match="xxh3_128 mismatch"):
            engine.restore()


def test_buffered_reads_land_in_the_tensors_and_only_the_rest_in_staging(tmp_path: Path) -> None:
    state, manifest, index = _saved_once(tmp_path, seed=7)
    targets: list[torch.Tensor | None] = [byte_view(t) for t in state.values()]
    targets[2] = None  # "half" is skipped: its bytes are read, hashed and dropped
    (entry,) = manifest.files
    staging = torch.empty(READ_CHUNK_BYTES, dtype=torch.uint8)
    (segment,) = plan_segments(entry, index, targets, direct=False)
    views = _landing(segment, staging, False, index, targets, entry.offset)
    assert sum(len(view) for view in views) == segment.size
    spare = range(staging.data_ptr(), staging.data_ptr() + len(staging))
    in_staging = [v for v in views if _address(v) in spare]
    assert sum(len(v) for v in in_staging) == entry.size - sum(
        e.nbytes for e, t in zip(manifest.tensors, targets, strict=True) if t is not None
    )
    for tensor in (t for t in targets if t is not None):
        assert any(_address(v) == tensor.data_ptr() for v in views)


def _address(view: memoryview) -> int:
    return torch.frombuffer(view, dtype=torch.uint8).data_ptr() if len(view) else -1


@pytest.mark.parametrize("direct_io", [True, "auto"])
def test_a_chunk_of_more_tensors_than_one_preadv_takes_restores(
    tmp_path: Path, direct_io: bool | str
) -> None:
    """3,000 small tensors in one chunk: more buffers than one preadv call accepts (1,024)."""
    generator = torch.Generator().manual_seed(8)
    state = {f"t{i}": torch.randn(5 + i % 7, generator=generator) for i in range(3000)}
    with _single_file(tmp_path, direct_io) as engine:
        assert engine.save(state, 1).wait().ok
        into = {name: torch.zeros_like(tensor) for name, tensor in state.items()}
        engine.restore(into=into)
    assert_bit_exact(state, into)
