"""The engine's slots: one host buffer each, and what snapshot it holds.

A slot's buffer is private memory (``HostBuffer``) or, for an engine whose node-mates read
it, a ``/dev/shm`` segment (``SharedBuffer``, ``goodput.checkpoint.engine.node_segments``)
whose header says which step it holds; either way it is one buffer per slot, reused.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import dataclass

from goodput.checkpoint.engine.buffers import HostBuffer
from goodput.checkpoint.engine.node_segments import NodeSegments, SegmentHeader, SharedBuffer
from goodput.checkpoint.engine.plan import SavePlan
from goodput.checkpoint.engine.snapshot import PendingCopy

log = logging.getLogger(__name__)


class SlotState(enum.Enum):
    FREE = "free"
    FILLING = "filling"
    PENDING = "pending"
    PERSISTING = "persisting"


@dataclass(eq=False)
class Slot:
    state: SlotState = SlotState.FILLING
    buffer: HostBuffer | SharedBuffer | None = None
    #: the snapshot the buffer holds (None while being filled): kept after persisting, so a
    #: rank that restarts in process can restore from memory (``host_snapshot``)
    step: int | None = None
    plan: SavePlan | None = None
    #: the copy that fills the buffer (an overlapped one may still run after ``save``)
    copy: PendingCopy | None = None

    def ensure_buffer(
        self, need: int, *, pin: bool, segments: NodeSegments | None
    ) -> HostBuffer | SharedBuffer:
        """The buffer, replaced only if too small or not pinned when pinning is wanted; a
        reused segment first says it no longer holds its step (node-mates read it)."""
        buffer = self.buffer
        if buffer is not None and buffer.capacity >= need and buffer.pin_requested >= pin:
            if isinstance(buffer, SharedBuffer):
                buffer.describe(SegmentHeader())
            return buffer
        if buffer is not None:
            buffer.release()
            self.buffer = None
        if segments is not None:
            try:
                self.buffer = segments.allocate(need, pin_memory=pin)
                return self.buffer
            except OSError as exc:
                log.warning("host buffer in private memory: no shared segment (%s)", exc)
        self.buffer = HostBuffer(need, pin=pin)
        return self.buffer

    def holds(self, step: int, plan: SavePlan, *, sharded: bool) -> None:
        """Record the snapshot now in the buffer (and tell the node, for a segment)."""
        if isinstance(self.buffer, SharedBuffer):
            self.buffer.describe(
                SegmentHeader(
                    step=step,
                    dp_rank=plan.dp_rank,
                    dp_world=plan.dp_world,
                    sharded=sharded,
                    slice_start=plan.slice_start,
                    nbytes=plan.slice_bytes,
                )
            )
