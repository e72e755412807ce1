"""Restores into CUDA state pin no memory that outlives them (issue 38): every staged copy to
the GPU goes through one buffer of at most ``GOODPUT_RESTORE_PINNED_MB``, page-locked with
``cudaHostRegister`` and released at the restore's end; torch's caching host allocator, which
kept a power-of-two block per CUDA tensor for the process's life, is not used. Pinned memory
after ten restores equals pinned memory after one (the CPU test,
tests/ckpt/test_pinned_staging.py, counts the same through a named fake allocator)."""

from __future__ import annotations

from pathlib import Path

import torch

from goodput.checkpoint.engine import CheckpointEngine
from goodput.checkpoint.engine.device_copy import RESTORE_PINNED_ENV, restore_pinned_bytes
from goodput.checkpoint.engine.events import CheckpointRestored
from tests.gpu.kit import GPU

pytestmark = GPU


def _held_by_caching_allocator() -> int:
    return int(torch.cuda.host_memory_stats().get("allocated_bytes.current", 0))


def test_pinned_memory_after_ten_restores_equals_after_one(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv(RESTORE_PINNED_ENV, "16")
    limit = restore_pinned_bytes()
    gen = torch.Generator(device="cuda").manual_seed(1)
    state = {
        "big": torch.randn(64 * 2**20 // 4, device="cuda", generator=gen),  # 64 MiB: 8 chunks
        "odd": torch.randn(1001, 333, device="cuda", generator=gen),
        "transposed": torch.randn(300, 200, device="cuda", generator=gen).t(),
    }
    expected = {k: v.cpu() for k, v in state.items()}
    restored: list[CheckpointRestored] = []

    def listen(event: object) -> None:
        if isinstance(event, CheckpointRestored):
            restored.append(event)

    with CheckpointEngine(tmp_path, listener=listen) as engine:
        assert engine.save(state, 1).wait().ok
        torch.cuda.synchronize()
        before = _held_by_caching_allocator()
        template = {k: torch.zeros_like(v) for k, v in state.items()}
        template["transposed"] = torch.zeros(300, 200, device="cuda").t()  # not contiguous
        held: list[int] = []
        for _ in range(10):
            for tensor in template.values():
                tensor.zero_()
            _, into = engine.restore(into=template)
            held.append(_held_by_caching_allocator())
            assert all(torch.equal(into[k].cpu(), expected[k]) for k in expected)
    assert held == [before] * 10, (before, held)
    assert len(restored) == 10
    assert {event.pinned_bytes for event in restored} == {limit}  # bounded, and reported
