"""What ``CheckpointEngine.save`` hands back: a handle that resolves to the save's result."""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Literal

from goodput.checkpoint.engine.snapshot import PendingCopy


@dataclass(frozen=True)
class SaveResult:
    step: int
    status: Literal["persisted", "failed", "dropped"]
    path: str | None = None
    bytes: int = 0
    duration_s: float = 0.0
    committed: bool = False
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "persisted"


class SaveHandle:
    """Completion of one save; ``wait()`` returns its SaveResult (it never raises).

    With ``save(..., overlap=True)`` the snapshot copy may still run when ``save`` returns;
    ``snapshotted()`` blocks until it is done (``CheckpointEngine.guard`` does that for you
    right before ``optimizer.step()``).
    """

    def __init__(self, step: int, copy: PendingCopy | None = None) -> None:
        self.step = step
        self.copy = copy
        self._done = threading.Event()
        self._result: SaveResult | None = None

    def snapshotted(self) -> None:
        """Block until the state is in host memory (after that, changing it is safe)."""
        if self.copy is not None:
            # A failed copy is the save's failed result; the state is no longer being read.
            with contextlib.suppress(RuntimeError, MemoryError):
                self.copy.wait()

    def _resolve(self, result: SaveResult) -> None:
        self._result = result
        self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> SaveResult:
        if not self._done.wait(timeout):
            raise TimeoutError(f"checkpoint step {self.step} not finished after {timeout}s")
        assert self._result is not None
        return self._result
