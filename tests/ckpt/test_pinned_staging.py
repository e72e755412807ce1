"""A restore's copies to the GPU go through one bounded pinned buffer, given back at its end
(``goodput.checkpoint.engine.device_copy``): pinned memory after ten restores equals pinned
memory after one.

CPU torch cannot page-lock memory, so the buffers come from CountingPinnedAllocator, a NAMED
FAKE of ``cudaHostRegister``'d buffers that counts what is held and is as strict as the real
thing where the staging depends on it: a buffer released twice, or used after its release,
fails. The copies themselves are real (CPU targets: the same chunked path, without the CUDA
events). The GPU kit repeats it with real restores into CUDA state
(tests/gpu/test_gpu_pinned_restore.py)."""

from __future__ import annotations

import pytest
import torch

from goodput.checkpoint.engine.buffers import HostBuffer
from goodput.checkpoint.engine.device_copy import (
    DEFAULT_RESTORE_PINNED_MB,
    RESTORE_PINNED_ENV,
    restore_pinned_bytes,
    staging_for,
)
from goodput.launch.rank_env import RankEnvError
from goodput.shim import ShimConfig

MIB = 2**20


class CountingPinnedAllocator:
    """Hands out host buffers as ``pinned_buffer`` does and counts the bytes held."""

    def __init__(self) -> None:
        self.held = 0
        self.peak = 0
        self.allocations = 0

    def __call__(self, nbytes: int) -> HostBuffer:
        allocator = self

        class FakePinnedBuffer(HostBuffer):
            def release(self) -> None:
                if self.capacity == 0:
                    raise RuntimeError("cudaHostUnregister: memory was not registered")
                allocator.held -= self.capacity
                self.capacity = 0
                super().release()

        buffer = FakePinnedBuffer(nbytes)
        self.allocations += 1
        self.held += buffer.capacity
        self.peak = max(self.peak, self.held)
        return buffer


def _state() -> list[torch.Tensor]:
    """Tensors larger and smaller than the 1 MiB bound, and a non-contiguous one."""
    gen = torch.Generator().manual_seed(3)
    return [
        torch.randn(3 * MIB // 4 + 17, generator=gen),  # 3 MiB of float32: many chunks
        torch.randint(0, 255, (1000,), dtype=torch.uint8, generator=gen),
        torch.randn(512, 300, generator=gen).t(),  # a transposed view: not contiguous
    ]


def _restore(saved: list[torch.Tensor], targets: list[torch.Tensor], allocate) -> int:
    """One restore's copies, as ``LoadTargets.finish`` makes them for CUDA targets."""
    sources = [t.contiguous().clone() for t in saved]  # the pageable staging
    staging = staging_for(
        [s.numel() * s.element_size() for s in sources],
        env={RESTORE_PINNED_ENV: "1"},
        allocate=allocate,
    )
    try:
        for target, source in zip(targets, sources, strict=True):
            staging.copy(target, source)
    finally:
        staging.close()
    return staging.peak_bytes


def test_pinned_memory_after_ten_restores_equals_after_one() -> None:
    allocator = CountingPinnedAllocator()
    saved = _state()
    targets = [
        torch.zeros(t.shape[::-1]).t() if not t.is_contiguous() else torch.zeros_like(t)
        for t in saved
    ]
    assert not targets[2].is_contiguous()
    peaks, held = [], []
    for _ in range(10):
        for target in targets:
            target.zero_()
        peaks.append(_restore(saved, targets, allocator))
        held.append(allocator.held)
        assert all(torch.equal(t, s) for t, s in zip(targets, saved, strict=True))
    assert held == [0] * 10  # each restore gave its buffer back
    assert allocator.peak == peaks[0] == peaks[-1] == MIB  # the bound, not the 3 MiB tensor
    assert allocator.allocations == 10  # one buffer per restore, whatever it copied


def test_a_restore_with_nothing_to_copy_pins_nothing() -> None:
    allocator = CountingPinnedAllocator()
    staging = staging_for([], env={RESTORE_PINNED_ENV: "not read"}, allocate=allocator)
    staging.close()
    assert staging.peak_bytes == allocator.allocations == 0
    # a small state pins no more than two halves of its largest copy (page-aligned)
    assert _restore([torch.ones(10)], [torch.zeros(10)], allocator) == 4096


def test_the_setting_bounds_the_buffer_and_refuses_nonsense() -> None:
    assert restore_pinned_bytes({}) == DEFAULT_RESTORE_PINNED_MB * MIB
    assert restore_pinned_bytes({RESTORE_PINNED_ENV: "256"}) == 256 * MIB
    for bad in ("0", "-3", "1.5", "lots"):
        with pytest.raises(ValueError, match=f"{RESTORE_PINNED_ENV}="):
            restore_pinned_bytes({RESTORE_PINNED_ENV: bad})


def test_a_rank_refuses_a_bad_setting_at_start(monkeypatch) -> None:
    """Read at each restore, it is checked where the rank's environment is read, in one line."""
    monkeypatch.setenv(RESTORE_PINNED_ENV, "0")
    with pytest.raises(RankEnvError, match=f"{RESTORE_PINNED_ENV}='0': a whole number of MiB"):
        ShimConfig.from_env()
