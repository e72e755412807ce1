"""Restore from host memory: the engine's buffer still holds the snapshot it persisted.

A rank restarting in process kept its memory, so reading its checkpoint back from the volume
is wasted time. The bytes come from the buffer instead, checked against the committed
manifest's per-file xxh3_128 (the manifest itself verified as on any restore), so a buffer
that does not hold exactly what was committed is never loaded: the caller falls back to the
volume. Only a buffer holding the whole state qualifies (``dp_world`` 1); a replica that
saved a slice reads the volume.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
import xxhash

from goodput.ckpt.buffers import byte_view
from goodput.ckpt.engine import CheckpointEngine
from goodput.ckpt.restore import _bind_targets, _check_coverage
from goodput.ckpt.tree import dtype_from_name, unflatten
from goodput.ckptfmt import KIND_ENGINE, ManifestError, read_manifest, step_dir


@dataclass(frozen=True)
class HostRestore:
    """A restore from host memory: the step, the state loaded, its size and duration."""

    step: int
    state: Any
    bytes: int
    duration_s: float


def restore_from_host(engine: CheckpointEngine, step: int, into: Any) -> HostRestore | str:
    """Load ``step`` from the engine's host buffer; a string says why not. Tensors of
    ``into`` with the checkpoint's shape and dtype are filled in place; the state returned
    has exactly the checkpoint's structure."""
    started = time.perf_counter()
    snapshot = engine.host_snapshot(step)
    if snapshot is None:
        return f"step {step} is no longer in host memory"
    plan, data = snapshot
    if plan.dp_world != 1:
        return f"host memory holds 1/{plan.dp_world} of step {step}"
    try:
        manifest = read_manifest(step_dir(engine.root, step))
        # a sharded checkpoint's buffer holds one rank's shards: the volume serves it
        if manifest.kind != KIND_ENGINE or manifest.step != step:
            return f"step {step}'s manifest is not the engine's checkpoint of that step"
        _check_coverage(manifest)
    except (ManifestError, OSError, ValueError) as exc:
        return f"step {step}'s manifest: {exc}"
    if [(t.offset, t.nbytes) for t in manifest.tensors] != [
        (t.offset, t.nbytes) for t in plan.tensors
    ]:
        return "the buffer's layout differs from the manifest's"
    view = memoryview(data.numpy())
    for entry in manifest.files:
        start = entry.offset - plan.slice_start
        if xxhash.xxh3_128_hexdigest(view[start : start + entry.size]) != entry.xxh3_128:
            return f"{entry.name}: the buffer does not match the committed checksum"
    targets: list[torch.Tensor | None] = [None] * len(manifest.tensors)
    _bind_targets(into, unflatten(manifest.tree), manifest, targets)
    for index, entry in enumerate(manifest.tensors):
        target = targets[index]
        if target is None:
            target = targets[index] = torch.empty(entry.shape, dtype=dtype_from_name(entry.dtype))
        if entry.nbytes:
            start = entry.offset - plan.slice_start
            source = data[start : start + entry.nbytes]
            if target.is_contiguous():
                byte_view(target).copy_(source)
            else:
                staged = torch.empty(entry.shape, dtype=dtype_from_name(entry.dtype))
                byte_view(staged).copy_(source)
                target.copy_(staged)
    # the checkpoint's structure, not ``into``'s: a live state may hold what the checkpoint
    # has not (an optimizer's moments from steps after it), which must not survive a restore
    state = unflatten(manifest.tree, lambda i: targets[i])
    return HostRestore(step, state, manifest.stream_bytes, time.perf_counter() - started)
