"""What the checkpoint engine reports, as small immutable records.

The engine never talks to the bus itself: it hands these to a listener callback, and the
trainer shim translates them into bus messages (``goodput.shim.ckpt_reports``, the one map).
A record the bus also carries has the bus event's name (``schemas.CheckpointSaved`` …), so a
checkpoint event is called one thing wherever it is read; the engine's records add what only
the engine knows (its data-parallel slice, throughput, commit). Listener errors are logged and
swallowed so that a broken listener can never stop training.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


def _now_ns() -> int:
    return time.time_ns()


@dataclass(frozen=True, kw_only=True)
class CheckpointSaved:
    """State copied into host buffers; training was blocked for ``stall_s``."""

    step: int
    stall_s: float
    bytes: int
    dp_rank: int = 0
    dp_world: int = 1
    ts_ns: int = field(default_factory=_now_ns)


@dataclass(frozen=True, kw_only=True)
class CheckpointPersisted:
    """This rank's data is durable. ``committed`` is true once the checkpoint is visible."""

    step: int
    path: str
    bytes: int
    duration_s: float
    gbps: float
    committed: bool
    dp_rank: int = 0
    dp_world: int = 1
    ts_ns: int = field(default_factory=_now_ns)


@dataclass(frozen=True, kw_only=True)
class CheckpointFailed:
    """A save could not be persisted; earlier checkpoints are untouched and training goes on."""

    step: int
    error: str
    dp_rank: int = 0
    ts_ns: int = field(default_factory=_now_ns)


@dataclass(frozen=True, kw_only=True)
class CheckpointDropped:
    """A snapshot waiting to be persisted was superseded by a newer one (newest wins)."""

    step: int
    superseded_by: int
    ts_ns: int = field(default_factory=_now_ns)


@dataclass(frozen=True, kw_only=True)
class RestoreFallback:
    """One checkpoint that restore skipped, and why."""

    step: int
    reason: str


@dataclass(frozen=True, kw_only=True)
class CheckpointRestored:
    """State loaded and verified from ``step`` after skipping ``fallbacks``."""

    step: int
    path: str
    bytes: int  # data bytes this process read (a sharded restore reads only its regions)
    duration_s: float
    fallbacks: tuple[RestoreFallback, ...] = ()
    ts_ns: int = field(default_factory=_now_ns)
    #: page-locked host memory the copies to the GPU went through, released since
    #: (``goodput.checkpoint.engine.device_copy``; 0: no CUDA tensor was staged)
    pinned_bytes: int = 0


@dataclass(frozen=True, kw_only=True)
class CheckpointRestoreFailed:
    """No checkpoint could be restored; ``fallbacks`` lists every candidate tried."""

    error: str
    fallbacks: tuple[RestoreFallback, ...] = ()
    ts_ns: int = field(default_factory=_now_ns)


@dataclass(frozen=True, kw_only=True)
class CheckpointRetentionDeleted:
    """An old complete checkpoint was removed to keep only the newest ``keep_last``."""

    step: int
    path: str
    ts_ns: int = field(default_factory=_now_ns)


CheckpointEvent = (
    CheckpointSaved
    | CheckpointPersisted
    | CheckpointFailed
    | CheckpointDropped
    | CheckpointRestored
    | CheckpointRestoreFailed
    | CheckpointRetentionDeleted
)
Listener = Callable[[CheckpointEvent], None]


def emit(listener: Listener | None, event: CheckpointEvent) -> None:
    """Deliver ``event``; a failing listener is logged, never propagated into training."""
    if listener is None:
        return
    try:
        listener(event)
    except Exception:
        log.exception("checkpoint event listener failed on %s", type(event).__name__)
