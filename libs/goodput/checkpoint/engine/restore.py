"""Restore: newest complete checkpoint first, every byte verified, fall back on any problem.

Data files are read ``io_threads`` at a time (each with a read ahead in flight), front to
back each, straight into the destination tensors (``goodput.checkpoint.engine.reader``);
the digest is computed on the way, so verification costs no second read. For O_DIRECT reads,
tensors the restore allocates are placed so that they are aligned like the file. When loading
into an existing state, CPU tensors are filled in place and CUDA tensors through pageable
host staging, copied to the GPU through one bounded pinned buffer released at the end
(``goodput.checkpoint.engine.device_copy``).
"""

from __future__ import annotations

import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from goodput.checkpoint.engine.buffers import HostBuffer, byte_view
from goodput.checkpoint.engine.device_copy import staging_for
from goodput.checkpoint.engine.events import (
    CheckpointRestored,
    CheckpointRestoreFailed,
    Listener,
    RestoreFallback,
    emit,
)
from goodput.checkpoint.engine.fileio import CorruptCheckpointError, DirectIOPolicy
from goodput.checkpoint.engine.load_into import bind_targets, merge_into
from goodput.checkpoint.engine.plan import IO_ALIGN, StreamIndex
from goodput.checkpoint.engine.reader import MIN_DIRECT_BYTES, READ_CHUNK_BYTES, read_data_file
from goodput.checkpoint.engine.sharded_load import load_sharded
from goodput.checkpoint.engine.tree import TreeError, dtype_from_name, unflatten
from goodput.checkpoint.format import (
    KIND_DCP,
    KIND_ENGINE,
    KIND_SHARDED,
    FileEntry,
    Manifest,
    ManifestError,
    read_manifest,
    step_dirs,
)


class NoCheckpointError(Exception):
    """No complete, intact checkpoint could be restored; ``fallbacks`` says why for each."""

    def __init__(self, message: str, fallbacks: tuple[RestoreFallback, ...]) -> None:
        detail = "".join(f"\n  step {f.step}: {f.reason}" for f in fallbacks)
        super().__init__(message + detail)
        self.fallbacks = fallbacks


@dataclass
class LoadTargets:
    """Where a manifest's tensors land: the tensors the restored state holds, the CPU byte
    views their bytes are written to, and the staged copies still to make into CUDA or
    non-contiguous targets (``finish``)."""

    tensors: list[torch.Tensor]
    views: list[torch.Tensor | None]
    late_copies: list[tuple[torch.Tensor, torch.Tensor]]
    #: the page-locked bytes the copies to the GPU went through (0: none went)
    pinned_bytes: int = 0

    def finish(self) -> None:
        """Copy the staged bytes into their targets: CUDA ones through one bounded pinned
        buffer, given back (with the staging) once every copy is done."""
        to_gpu = [(t, s) for t, s in self.late_copies if t.is_cuda]
        staging = staging_for([s.numel() * s.element_size() for _, s in to_gpu])
        try:
            for target, source in self.late_copies:
                if target.is_cuda:
                    staging.copy(target, source)
                else:
                    target.copy_(source)
        finally:
            staging.close()
        self.pinned_bytes = staging.peak_bytes
        self.late_copies = []

    def state(self, manifest: Manifest) -> Any:
        """The checkpoint's structure holding the loaded tensors."""
        return unflatten(
            manifest.tree, lambda i: self.tensors[i], tensor_count=len(manifest.tensors)
        )


def prepare_targets(
    manifest: Manifest,
    into: Any,
    policy: DirectIOPolicy,
    *,
    whole: frozenset[int] = frozenset(),
) -> LoadTargets:
    """Bind the tensors of ``into`` that match the checkpoint's, allocate the others.

    A CUDA or non-contiguous target gets a host staging tensor to receive its bytes, except
    the ``whole`` ones: tensors whose bytes are copied in one piece from host memory, which a
    contiguous target (CUDA included) takes directly."""
    targets: list[torch.Tensor | None] = [None] * len(manifest.tensors)
    skeleton = unflatten(manifest.tree, tensor_count=len(manifest.tensors))  # before allocating
    if into is not None:
        bind_targets(into, skeleton, manifest, targets)
    tensors: list[torch.Tensor] = []
    views: list[torch.Tensor | None] = []
    late_copies: list[tuple[torch.Tensor, torch.Tensor]] = []
    for index, entry in enumerate(manifest.tensors):
        dtype = dtype_from_name(entry.dtype)
        target = targets[index]
        if target is None:
            target = (
                _aligned_like_file(entry.shape, dtype, entry.offset)
                if policy.wanted_for_reads
                else torch.empty(entry.shape, dtype=dtype)
            )
        tensors.append(target)
        fill = target
        direct = target.is_contiguous() and (index in whole or not target.is_cuda)
        if not direct:
            fill = torch.empty(entry.shape, dtype=dtype)  # pageable: see LoadTargets.finish
            late_copies.append((target, fill))
        views.append(byte_view(fill) if entry.nbytes else None)
    return LoadTargets(tensors, views, late_copies)


def read_files(
    path: Path,
    files: list[FileEntry],
    index: StreamIndex,
    views: list[torch.Tensor | None],
    io_threads: int,
    policy: DirectIOPolicy,
) -> None:
    """Read and verify ``files`` of the checkpoint at ``path`` into the byte ``views``,
    ``io_threads`` files at a time; raises CorruptCheckpointError on any bad byte."""
    if not files:
        return
    workers = max(1, min(io_threads, len(files)))
    stagings = [HostBuffer(2 * READ_CHUNK_BYTES) for _ in range(workers)]
    try:
        with (
            ThreadPoolExecutor(workers, thread_name_prefix="goodput-ckpt-read") as pool,
            ThreadPoolExecutor(workers, thread_name_prefix="goodput-ckpt-readahead") as ahead,
        ):
            futures = [
                pool.submit(
                    _read_files,
                    path,
                    files[w::workers],
                    index,
                    views,
                    (
                        stagings[w].data[:READ_CHUNK_BYTES],
                        stagings[w].data[READ_CHUNK_BYTES:],
                    ),
                    ahead,
                    policy,
                )
                for w in range(workers)
            ]
            errors = [exc for future in futures if (exc := future.exception()) is not None]
    finally:
        for staging in stagings:
            staging.release()
    if errors:
        raise errors[0]


def load_checkpoint(
    path: Path,
    manifest: Manifest,
    *,
    into: Any = None,
    io_threads: int = 2,
    policy: DirectIOPolicy | None = None,
    merge: bool = True,
) -> tuple[Any, int]:
    """Load one verified checkpoint; raises CorruptCheckpointError on any bad byte. Returns
    the state and the pinned bytes its GPU copies went through. ``merge``: return ``into``
    updated (else the checkpoint's structure, ``into``'s tensors filled in place in it)."""
    policy = policy or DirectIOPolicy()
    targets = prepare_targets(manifest, into, policy)
    index = StreamIndex(manifest.tensors)
    read_files(path, manifest.files, index, targets.views, io_threads, policy)
    targets.finish()
    restored = targets.state(manifest)
    state = merge_into(into, restored) if merge and into is not None else restored
    return state, targets.pinned_bytes


def _read_files(
    path: Path,
    entries: list[FileEntry],
    index: StreamIndex,
    views: list[torch.Tensor | None],
    stagings: tuple[torch.Tensor, torch.Tensor],
    ahead: ThreadPoolExecutor,
    policy: DirectIOPolicy,
) -> None:
    for entry in entries:
        read_data_file(path / entry.name, entry, index, views, stagings, ahead, policy)


def _aligned_like_file(shape: list[int], dtype: torch.dtype, offset: int) -> torch.Tensor:
    """A new tensor whose address is ``offset`` modulo the page size, so that O_DIRECT reads
    its bytes straight into it (large tensors only: this costs up to a page per tensor)."""
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if nbytes < MIN_DIRECT_BYTES:
        return torch.empty(shape, dtype=dtype)
    raw = torch.empty(nbytes + IO_ALIGN, dtype=torch.uint8)
    skip = (offset - raw.data_ptr()) % IO_ALIGN
    return raw[skip : skip + nbytes].view(dtype).view(shape)


def restore_checkpoint(
    root: str | os.PathLike,
    *,
    step: int | None = None,
    into: Any = None,
    io_threads: int = 2,
    policy: DirectIOPolicy | None = None,
    listener: Listener | None = None,
    merge: bool = True,
) -> tuple[int, Any]:
    """Load the newest intact checkpoint at or before ``step`` (any step if None).

    Every candidate that is incomplete, corrupt or of another kind is skipped and reported
    as a fallback. Raises NoCheckpointError when nothing can be loaded (``into`` may then
    hold partial data and should not be trained on). ``into`` is the template (a DTensor's
    local shard is what it loads); ``merge=False`` returns the checkpoint's own structure
    holding ``into``'s tensors, not ``into`` updated.
    """
    started = time.perf_counter()
    fallbacks: list[RestoreFallback] = []
    for candidate, path in step_dirs(root):
        if step is not None and candidate > step:
            continue
        try:
            manifest = read_manifest(path)
            if manifest.kind == KIND_DCP:
                raise CorruptCheckpointError(
                    "written by 'dcp'; load it with dcp.load and GoodputStorageReader"
                )
            if manifest.kind not in (KIND_ENGINE, KIND_SHARDED):
                raise CorruptCheckpointError(f"written by {manifest.kind!r}, not the engine")
            if manifest.step != candidate:
                raise CorruptCheckpointError(f"manifest says step {manifest.step}")
            if manifest.kind == KIND_SHARDED:  # DTensor state, resharded to the target's
                state, read = load_sharded(
                    path, manifest, into=into, io_threads=io_threads, policy=policy, merge=merge
                )
                pinned = 0  # its GPU copies are from pageable staging
            else:
                state, pinned = load_checkpoint(
                    path, manifest, into=into, io_threads=io_threads, policy=policy, merge=merge
                )
                read = manifest.total_bytes
        except (ManifestError, CorruptCheckpointError, TreeError) as exc:
            fallbacks.append(RestoreFallback(step=candidate, reason=str(exc)))
            continue
        emit(
            listener,
            CheckpointRestored(
                step=candidate,
                path=str(path),
                bytes=read,
                duration_s=time.perf_counter() - started,
                fallbacks=tuple(fallbacks),
                pinned_bytes=pinned,
            ),
        )
        return candidate, state
    message = f"no intact checkpoint under {root}" + (f" at or before step {step}" if step else "")
    emit(listener, CheckpointRestoreFailed(error=message, fallbacks=tuple(fallbacks)))
    raise NoCheckpointError(message, tuple(fallbacks))
