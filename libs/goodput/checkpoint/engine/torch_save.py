"""The baseline checkpointer: synchronous ``torch.save`` of the whole state to shared storage.

What a training script does without goodput: rank 0 writes ``step-<n>.pt`` and training
waits until the file is on disk (written to a temporary name, fsynced, renamed, so a crash
leaves no half file under the real name); every rank loads the newest file on restart. It
offers the methods of :class:`~goodput.checkpoint.engine.CheckpointEngine` the trainer shim uses and
reports the same events, so the goodput calculator charges its stall like the engine's. Files
are loaded with torch's safe unpickler (``weights_only=True``): a forged file runs no code.
``goodput demo --compare-baseline`` runs the job with it (``GOODPUT_CKPT_MODE=torch-save``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch

from goodput.checkpoint.engine.catalog import known_clean_through
from goodput.checkpoint.engine.events import (
    CheckpointPersisted,
    CheckpointRestored,
    CheckpointRestoreFailed,
    CheckpointSaved,
    Listener,
    RestoreFallback,
    emit,
)
from goodput.checkpoint.engine.restore import NoCheckpointError
from goodput.checkpoint.engine.sharded_save import is_dtensor
from goodput.checkpoint.engine.tree import flatten
from goodput.checkpoint.format import parse_step_dir, step_dir_name
from goodput.checkpoint.index.retention import DEFAULT_KEEP, clean_step, decide_retention
from goodput.schemas.tiers import LOCAL

_SUFFIX = ".pt"


def checkpoint_path(root: Path, step: int) -> Path:
    return root / f"{step_dir_name(step)}{_SUFFIX}"


class TorchSaveCheckpointer:
    """Blocking saves by the one ``writer`` rank into ``root``; loads by every rank."""

    def __init__(
        self,
        root: str | os.PathLike,
        *,
        writer: bool,
        keep_last: int = DEFAULT_KEEP[LOCAL],
        listener: Listener | None = None,
    ) -> None:
        self.root = Path(root)
        self.writer = writer
        self.keep_last = keep_last
        self.listener = listener

    def save(self, state: Any, step: int, *, dp_rank: int = 0, dp_world: int = 1) -> None:
        """Write the checkpoint and return once it is durable (non-writers return at once).

        Every rank refuses a state holding DTensors: one file of rank 0's view is all this
        mode keeps, so rank 1 would silently restore rank 0's shard."""
        if any(is_dtensor(tensor) for tensor in flatten(state).tensors):
            raise ValueError(
                "torch-save mode cannot save DTensors: rank 1 would silently restore rank 0's"
                " shard; use the engine mode (GOODPUT_CKPT_MODE=async)"
            )
        if not self.writer:
            return
        started = time.perf_counter()
        self.root.mkdir(parents=True, exist_ok=True)
        final = checkpoint_path(self.root, step)
        partial = final.with_suffix(".pt.partial")
        with open(partial, "wb") as out:
            torch.save(state, out)
            out.flush()
            os.fsync(out.fileno())
        os.replace(partial, final)
        elapsed = time.perf_counter() - started
        size = final.stat().st_size
        emit(self.listener, CheckpointSaved(step=step, stall_s=elapsed, bytes=size))
        emit(
            self.listener,
            CheckpointPersisted(
                step=step,
                path=str(final),
                bytes=size,
                duration_s=elapsed,
                gbps=size / elapsed / 1e9 if elapsed > 0 else 0.0,
                committed=True,
            ),
        )
        self._apply_retention()

    def steps(self) -> list[int]:
        if not self.root.is_dir():
            return []
        names = [p.name for p in self.root.iterdir() if p.name.endswith(_SUFFIX)]
        return sorted(
            step
            for name in names
            if (step := parse_step_dir(name.removesuffix(_SUFFIX))) is not None
        )

    def latest_complete_step(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    def restore(self, step: int | None = None, into: Any = None) -> tuple[int, Any]:
        """Load the newest checkpoint at or before ``step``, skipping files that fail to load."""
        fallbacks: list[RestoreFallback] = []
        for candidate in reversed(self.steps()):
            if step is not None and candidate > step:
                continue
            path = checkpoint_path(self.root, candidate)
            started = time.perf_counter()
            try:
                # torch's safe unpickler: tensors and plain values, never arbitrary code
                state = torch.load(path, map_location="cpu", weights_only=True)
            except Exception as exc:  # a truncated or corrupt file: try the one before
                fallbacks.append(
                    RestoreFallback(step=candidate, reason=f"{type(exc).__name__}: {exc}")
                )
                continue
            emit(
                self.listener,
                CheckpointRestored(
                    step=candidate,
                    path=str(path),
                    bytes=path.stat().st_size,
                    duration_s=time.perf_counter() - started,
                    fallbacks=tuple(fallbacks),
                ),
            )
            return candidate, state
        error = f"no loadable torch.save checkpoint in {self.root}"
        emit(self.listener, CheckpointRestoreFailed(error=error, fallbacks=tuple(fallbacks)))
        raise NoCheckpointError(error, tuple(fallbacks))

    def close(self) -> None:
        """Nothing is in flight: every save finished before it returned."""

    def _apply_retention(self) -> None:
        """The plain keep-newest rule (no replicator copies ``.pt`` files, so no record of
        safe steps can apply to them), and the known-clean checkpoint kept."""
        if self.keep_last <= 0:
            return
        steps = self.steps()
        protected = clean_step(steps, known_clean_through(self.root))
        for old in decide_retention(steps, steps, self.keep_last, None, protected).delete:
            checkpoint_path(self.root, old).unlink(missing_ok=True)
