"""Loading into an existing state: which of its tensors receive which checkpoint tensors, and
the restored values merged back into it.

Every loader shares these rules (the whole-stream restore, the sharded one, the restore from
host memory), so they live below all of them; a loader that needs another's rules would
otherwise import it back.
"""

from __future__ import annotations

from typing import Any

import torch

from goodput.checkpoint.engine.tree import TensorRef, dtype_name
from goodput.checkpoint.format import Manifest


class StateMismatchError(ValueError):
    """The state to load into has a tensor whose shape or dtype differs from the checkpoint."""


def bind_targets(into: Any, restored: Any, manifest: Manifest, targets: list[Any]) -> None:
    """Record which existing tensors of ``into`` receive which checkpoint tensors (``restored``:
    the checkpoint's structure of ``TensorRef``); raises StateMismatchError for a tensor of
    another shape or dtype."""
    if isinstance(restored, TensorRef):
        if isinstance(into, torch.Tensor):
            entry = manifest.tensors[restored.index]
            if list(into.shape) != entry.shape or dtype_name(into.dtype) != entry.dtype:
                raise StateMismatchError(
                    f"tensor {restored.index}: have {dtype_name(into.dtype)}{list(into.shape)},"
                    f" checkpoint has {entry.dtype}{entry.shape}"
                )
            targets[restored.index] = into
        return
    if isinstance(restored, dict) and isinstance(into, dict):
        for key, value in restored.items():
            if key in into:
                bind_targets(into[key], value, manifest, targets)
    elif (
        isinstance(restored, list | tuple)
        and isinstance(into, list | tuple)
        and len(restored) == len(into)
    ):
        for into_item, restored_item in zip(into, restored, strict=True):
            bind_targets(into_item, restored_item, manifest, targets)


def merge_into(into: Any, restored: Any) -> Any:
    """Put every restored value into ``into`` (mutable containers are updated in place)."""
    if isinstance(into, dict) and isinstance(restored, dict):
        for key, value in restored.items():
            into[key] = merge_into(into[key], value) if key in into else value
        return into
    if isinstance(into, list) and isinstance(restored, list) and len(into) == len(restored):
        into[:] = [merge_into(a, b) for a, b in zip(into, restored, strict=True)]
        return into
    return restored
