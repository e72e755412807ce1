"""Reusable host buffers and the snapshot copy into them.

A buffer is one page-aligned uint8 CPU tensor (aligned so O_DIRECT can write straight from
it). Where CUDA is available it is page-locked with ``cudaHostRegister`` rather than taken
from the caching host allocator, which rounds sizes up to a power of two and would nearly
double the memory of a large snapshot. CUDA tensors are copied on a side stream with
non-blocking copies and a single synchronize; CPU tensors with plain copies.
"""

from __future__ import annotations

import threading

import torch

from goodput.ckpt.plan import IO_ALIGN, SavePlan, align_up


class HostBuffer:
    """A page-aligned byte buffer reused across saves, pinned when ``pin`` and CUDA exist."""

    def __init__(self, nbytes: int, *, pin: bool = False) -> None:
        self.capacity = align_up(max(nbytes, IO_ALIGN), IO_ALIGN)
        raw = torch.empty(self.capacity + IO_ALIGN, dtype=torch.uint8)
        skip = (-raw.data_ptr()) % IO_ALIGN
        self._raw = raw
        self.data = raw[skip : skip + self.capacity]
        self.pin_requested = pin
        self.pinned = False
        if pin and torch.cuda.is_available():
            code = torch.cuda.cudart().cudaHostRegister(self.data.data_ptr(), self.capacity, 0)
            self.pinned = int(code) == 0

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


class Snapshotter:
    """Copies the planned slice of a state into a host buffer, blocking only for the copy."""

    def __init__(self) -> None:
        self._streams: dict[int, torch.cuda.Stream] = {}
        self._lock = threading.Lock()

    def _side_stream(self, device: torch.device) -> torch.cuda.Stream:
        with self._lock:
            index = device.index if device.index is not None else torch.cuda.current_device()
            if index not in self._streams:
                self._streams[index] = torch.cuda.Stream(device=index)
            return self._streams[index]

    def copy(self, tensors: list[torch.Tensor], plan: SavePlan, buffer: HostBuffer) -> None:
        base = plan.slice_start
        cuda_pieces: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        for tensor, entry in zip(tensors, plan.tensors, strict=True):
            lo = max(plan.slice_start, entry.offset)
            hi = min(plan.slice_end, entry.offset + entry.nbytes)
            if lo >= hi:
                continue
            source = byte_view(tensor)[lo - entry.offset : hi - entry.offset]
            target = buffer.data[lo - base : hi - base]
            if tensor.is_cuda:
                cuda_pieces.setdefault(tensor.device.index or 0, []).append((source, target))
            else:
                target.copy_(source)
        streams = []
        for index, pieces in cuda_pieces.items():
            device = torch.device("cuda", index)
            stream = self._side_stream(device)
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                for source, target in pieces:
                    target.copy_(source, non_blocking=True)
            streams.append(stream)
        for stream in streams:
            stream.synchronize()


def slice_nbytes(plan: SavePlan) -> int:
    """Bytes a host buffer needs for ``plan`` (rounded so the last O_DIRECT write fits)."""
    return align_up(plan.slice_bytes, IO_ALIGN)
