"""A restore's host-to-GPU copies, through one bounded page-locked buffer it releases at the end.

A copy from pageable memory to a GPU goes through the driver's own small staging and blocks
the host; from page-locked memory it is one DMA. A restore used to stage every CUDA tensor in
its own pinned tensor from torch's caching host allocator (``pin_memory=True``), which rounds
each block up to a power of two and keeps it for the life of the process: after a restore a
rank held up to twice its CUDA state pinned, on top of the engine's own pinned slot — with
eight ranks per node, eight times that, never given back.

Now the bytes land in pageable staging (freed with the restore) and each CUDA tensor streams
through :class:`PinnedStaging`: one buffer of at most :func:`restore_pinned_bytes` (the
setting, ``GOODPUT_RESTORE_PINNED_MB``, owned here), page-locked with ``cudaHostRegister``
(:class:`~goodput.checkpoint.engine.buffers.HostBuffer`, not the caching allocator) and
unregistered when the restore ends. Its two halves alternate: the host copies a chunk into
one while the DMA out of the other runs; a half is refilled only once its copy is done (a
CUDA event). A sharded restore (``sharded_load``) copies its staging to the GPU from pageable
memory and pins nothing.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

import torch

from goodput.checkpoint.engine.buffers import HostBuffer, byte_view

#: the environment variable that bounds a restore's page-locked staging, per process (MiB)
RESTORE_PINNED_ENV = "GOODPUT_RESTORE_PINNED_MB"
#: its default: 64 MiB keeps a PCIe 5 / NVLink-C2C copy at full speed (32 MiB chunks)
DEFAULT_RESTORE_PINNED_MB = 64


def restore_pinned_bytes(env: Mapping[str, str] | None = None) -> int:
    """The most page-locked memory one restore stages through (bytes); a value that is not a
    whole number of MiB of at least 1 raises ValueError naming the variable."""
    raw = (os.environ if env is None else env).get(RESTORE_PINNED_ENV)
    if raw is None or raw.strip() == "":
        return DEFAULT_RESTORE_PINNED_MB * 2**20
    try:
        mib = int(raw)
    except ValueError:
        mib = 0
    if mib < 1:
        raise ValueError(f"{RESTORE_PINNED_ENV}={raw!r}: a whole number of MiB, at least 1")
    return mib * 2**20


def staging_for(
    sizes: list[int],
    env: Mapping[str, str] | None = None,
    allocate: Callable[[int], HostBuffer] | None = None,
) -> PinnedStaging:
    """The staging for copies of ``sizes`` bytes: never more than the setting, nor more than
    two halves of the largest copy (none at all for no copy: the setting is not read)."""
    limit = min(restore_pinned_bytes(env), 2 * max(sizes)) if sizes else 0
    return PinnedStaging(limit, allocate or pinned_buffer)


def pinned_buffer(nbytes: int) -> HostBuffer:
    """A buffer page-locked with ``cudaHostRegister`` (unpinned where CUDA is not)."""
    return HostBuffer(nbytes, pin=True)


class PinnedStaging:
    """Copies host tensors into (GPU) targets through one buffer of ``limit_bytes`` (the
    caller bounds it: :func:`staging_for`), taken from ``allocate`` at the first copy and
    released by :meth:`close`."""

    def __init__(
        self, limit_bytes: int, allocate: Callable[[int], HostBuffer] = pinned_buffer
    ) -> None:
        self.limit_bytes = limit_bytes
        self._allocate = allocate
        self._buffer: HostBuffer | None = None
        self._done: list[torch.cuda.Event | None] = [None, None]
        self._cuda = False
        #: the buffer's size while it was held (0: no copy needed one), for the report
        self.peak_bytes = 0

    def copy(self, target: torch.Tensor, source: torch.Tensor) -> None:
        """``target.copy_(source)``; ``source`` is a contiguous host tensor of ``target``'s
        shape and dtype, which must stay unchanged until :meth:`close`."""
        into = (
            target
            if target.is_contiguous()
            else torch.empty(target.shape, dtype=target.dtype, device=target.device)
        )
        src, dst = byte_view(source), byte_view(into)
        if dst.numel() == 0:
            return
        halves = self._halves()
        step = halves[0].numel()
        for chunk, lo in enumerate(range(0, dst.numel(), step)):
            half, hi = chunk % 2, min(lo + step, dst.numel())
            done = self._done[half]
            if done is not None:
                done.synchronize()  # the DMA out of this half has finished
            halves[half][: hi - lo].copy_(src[lo:hi])
            dst[lo:hi].copy_(halves[half][: hi - lo], non_blocking=into.is_cuda)
            if into.is_cuda:
                self._cuda = True
                event = torch.cuda.Event()
                event.record()
                self._done[half] = event
        if into is not target:
            target.copy_(into)

    def close(self) -> None:
        """Wait for the copies, then give the buffer back (unregistered, freed)."""
        if self._cuda:
            torch.cuda.synchronize()
        self._done = [None, None]
        if self._buffer is not None:
            self._buffer.release()
            self._buffer = None

    def _halves(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._buffer is None:
            self._buffer = self._allocate(self.limit_bytes)
            self.peak_bytes = max(self.peak_bytes, self._buffer.capacity)
        data = self._buffer.data
        half = data.numel() // 2
        return data[:half], data[half : 2 * half]
