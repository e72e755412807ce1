"""Reusable host buffers for snapshots and restores.

A buffer is one page-aligned uint8 CPU tensor (aligned so O_DIRECT can write straight from
it). Where CUDA is available it is page-locked with ``cudaHostRegister`` rather than taken
from the caching host allocator, which rounds sizes up to a power of two and would nearly
double the memory of a large snapshot. The copy into a buffer is ``goodput.checkpoint.engine.snapshot``.
"""

from __future__ import annotations

import torch

from goodput.checkpoint.engine.plan import IO_ALIGN, SavePlan, align_up


def pin_host(data: torch.Tensor, wanted: bool) -> bool:
    """Page-lock ``data`` with ``cudaHostRegister`` when wanted and CUDA exists; whether it is."""
    if not wanted or not torch.cuda.is_available():
        return False
    code = torch.cuda.cudart().cudaHostRegister(data.data_ptr(), data.numel(), 0)
    return int(code) == 0


class HostBuffer:
    """A page-aligned byte buffer reused across saves, pinned when ``pin`` and CUDA exist."""

    def __init__(self, nbytes: int, *, pin: bool = False) -> None:
        self.capacity = align_up(max(nbytes, IO_ALIGN), IO_ALIGN)
        raw = torch.empty(self.capacity + IO_ALIGN, dtype=torch.uint8)
        skip = (-raw.data_ptr()) % IO_ALIGN
        self._raw = raw
        self.data = raw[skip : skip + self.capacity]
        self.pin_requested = pin
        self.pinned = pin_host(self.data, pin)

    def release(self) -> None:
        if self.pinned:
            torch.cuda.cudart().cudaHostUnregister(self.data.data_ptr())
            self.pinned = False
        self.data = torch.empty(0, dtype=torch.uint8)
        self._raw = self.data


def byte_view(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as a flat uint8 tensor (a copy only if it is not contiguous)."""
    flat = tensor.contiguous().reshape(-1)
    if flat.dtype == torch.uint8:
        return flat
    return flat.view(torch.uint8)


def slice_nbytes(plan: SavePlan) -> int:
    """Bytes a host buffer needs for ``plan`` (rounded so the last O_DIRECT write fits)."""
    return align_up(plan.slice_bytes, IO_ALIGN)
