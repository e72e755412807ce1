"""CheckpointEngine: async save into reused host buffers, background persist, atomic commit.

``save`` blocks only while the state is copied into a host buffer ("slot"), or hardly at all
with ``overlap=True`` (planning and the copy then run on a planner thread and the copy
threads during the next forward/backward, and ``guard`` makes the optimizer step wait for
them; see ``goodput.checkpoint.engine.snapshot``); a worker thread then writes the slot's data files from
several threads, fsyncs, and commits (``goodput.checkpoint.engine.persist``: manifest last, then the
directory rename). At most ``max_inflight`` slots exist (fewer if the memory budget
says so). A save that finds every slot busy takes over the slot of a snapshot still waiting
to be persisted (that older snapshot is dropped: the newest wins); if the only busy slots are
being written, it waits for one. Any persist error becomes a failed result and event; the
training loop goes on and earlier checkpoints are untouched.

Host memory: each slot's ``HostBuffer`` holds one snapshot's bytes laid out as its
``SavePlan`` says (tensor ``i`` at ``plan.tensors[i].offset - plan.slice_start``); a slot
is reused only after its snapshot is persisted or dropped.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from goodput.checkpoint.engine import catalog
from goodput.checkpoint.engine.buffers import slice_nbytes
from goodput.checkpoint.engine.events import (
    CheckpointDropped,
    CheckpointFailed,
    CheckpointSaved,
    Listener,
    emit,
)
from goodput.checkpoint.engine.fileio import DirectIOPolicy, DirectMode
from goodput.checkpoint.engine.handles import SaveHandle, SaveResult
from goodput.checkpoint.engine.node_segments import NodeSegments, PeerSegment, SharedBuffer
from goodput.checkpoint.engine.parts_commit import PartLayout
from goodput.checkpoint.engine.persist import Persister
from goodput.checkpoint.engine.plan import MIN_FILE_BYTES, SavePlan
from goodput.checkpoint.engine.restore import restore_checkpoint
from goodput.checkpoint.engine.sharded_save import ShardedSave, plan_save
from goodput.checkpoint.engine.slots import Slot, SlotState
from goodput.checkpoint.engine.snapshot import PendingCopy, Snapshotter, default_copy_threads
from goodput.checkpoint.engine.tree import FlatState, flatten
from goodput.checkpoint.index.retention import DEFAULT_KEEP
from goodput.schemas.tiers import LOCAL

log = logging.getLogger(__name__)


@dataclass(eq=False)
class _Job:
    step: int
    plan: SavePlan
    tree: Any
    slot: Slot
    handle: SaveHandle
    copy: PendingCopy
    metadata: dict[str, Any] = field(default_factory=dict)
    #: a DTensor state's shards (``goodput.checkpoint.engine.sharded_save``); None for a plain state
    sharded: ShardedSave | None = None


class CheckpointEngine:
    """Asynchronous, verified checkpoints of a nested state under ``root``.

    Each replica's data is split into ``2 * writer_threads`` files, written ``writer_threads``
    at a time, and restored ``read_threads`` at a time: every file read through the page cache
    has its own readahead in flight: here two streams beat four or eight (docs/BENCHMARKS.md).
    ``direct_io``: writes take O_DIRECT ("auto": where the filesystem allows it), reads only
    when it is ``True`` (page-cache reads restore faster, see ``goodput.checkpoint.engine.fileio``).
    ``keep_last``: after each save, older checkpoints go as :func:`catalog.apply_retention`
    allows (none the replicator has not made safe; its keep count where it serves); 0: none.
    ``node_shared``: the host buffers are ``/dev/shm`` segments the node's other ranks read
    after an in-process restart (``engine.node_segments``); else private memory.
    ``parts``: a DTensor state spans nodes; each node's ranks save the node's part into its
    root, committed with every other part (``goodput.checkpoint.engine.parts_commit``).
    ``copy_threads``: a CPU copy's threads, the saving one included; default: a share of the
    cores for each of the host's ``local_ranks`` (``parts.local_world``, else 1) ranks.
    """

    def __init__(
        self,
        root: str | os.PathLike,
        *,
        keep_last: int = DEFAULT_KEEP[LOCAL],
        writer_threads: int = 4,
        read_threads: int = 2,
        direct_io: DirectMode = "auto",
        max_inflight: int = 1,
        memory_budget_bytes: int | None = None,
        listener: Listener | None = None,
        min_file_bytes: int = MIN_FILE_BYTES,
        dp_commit_timeout_s: float = 600.0,
        copy_threads: int | None = None,
        node_shared: bool = False,
        parts: PartLayout | None = None,
        local_ranks: int | None = None,
    ) -> None:
        if min(max_inflight, writer_threads, read_threads) < 1:
            raise ValueError("max_inflight, writer_threads and read_threads must be at least 1")
        self.root = Path(root)
        self.keep_last = keep_last
        self.writer_threads = writer_threads
        self.read_threads = read_threads
        self.max_inflight = max_inflight
        self.memory_budget_bytes = memory_budget_bytes
        self.listener = listener
        self.min_file_bytes = min_file_bytes
        self.dp_commit_timeout_s = dp_commit_timeout_s
        self.parts = parts
        self._policy = DirectIOPolicy(direct_io)
        self._segments = NodeSegments(self.root) if node_shared else None
        ranks_here = local_ranks or (parts.local_world if parts is not None else 1)
        self._snapshotter = Snapshotter(copy_threads or default_copy_threads(ranks_here))
        self._copying: list[PendingCopy] = []
        self._cond = threading.Condition()
        self._slots: list[Slot] = []
        self._pending: deque[_Job] = deque()
        self._persisting = False
        self._closed = False
        self._pool = ThreadPoolExecutor(writer_threads, thread_name_prefix="goodput-ckpt-write")
        self._persister = Persister(
            self.root, self._pool, self._policy, listener, dp_commit_timeout_s
        )
        self._planner = ThreadPoolExecutor(1, thread_name_prefix="goodput-ckpt-plan")
        self._planning = 0
        self._worker = threading.Thread(target=self._run, name="goodput-ckpt-persist", daemon=True)
        self._worker.start()

    # -- saving -------------------------------------------------------------------------

    def save(
        self,
        state: Any,
        step: int,
        *,
        overlap: bool = False,
        dp_rank: int = 0,
        dp_world: int = 1,
        metadata: dict[str, Any] | None = None,
    ) -> SaveHandle:
        """Snapshot ``state`` into host buffers and return; persisting goes on in background.

        With ``overlap`` the snapshot itself also runs on after ``save`` returns, during the
        next forward/backward: ``save`` only walks the state (to check it) and hands it to a
        planner thread, which plans the files, takes a slot (allocating or waiting for it) and
        launches the chunked copy. The state must not change until ``handle.snapshotted()``
        or ``engine.wait_snapshot()`` returns, which is what the optimizer hook installed by
        ``guard(optimizer)`` does before each step. Without it ``save`` returns once copied.

        With ``dp_world`` > 1, every replica calls this with identical state and writes only
        its slice; replica 0 commits once all slices are durable (the plain values saved are
        replica 0's, so per-replica RNG states belong in per-rank checkpoints). Invalid states raise
        (TypeError/ValueError); IO problems never do, they end in a failed result and event.

        With DTensors (FSDP2) ``dp_rank``/``dp_world`` index the ranks sharing ``root`` (with
        ``parts``, the layout's global ranks do); each writes its own shards, which ``restore``
        reshards (``goodput.checkpoint.engine.sharded_save``).
        """
        started = time.perf_counter()
        if not 0 <= step < 10**10:
            raise ValueError(f"step must be in [0, 1e10), got {step}")
        if not 0 <= dp_rank < dp_world:
            raise ValueError(f"dp_rank {dp_rank} outside dp_world {dp_world}")
        flat = flatten(state)
        if not overlap:
            self._wait_planned()
            return self._snapshot(flat, step, dp_rank, dp_world, metadata, started)
        # Planning, taking a slot (maybe allocating its buffer) and launching the chunked copy
        # all run on the planner thread: the training thread only hands the save over.
        copy = PendingCopy.deferred(flat.tensors)
        handle = SaveHandle(step, copy)
        with self._cond:
            if self._closed:
                raise RuntimeError("checkpoint engine is closed")
            self._planning += 1
            self._copying.append(copy)
        self._planner.submit(
            self._snapshot_planned,
            flat,
            step,
            dp_rank,
            dp_world,
            metadata,
            handle,
            time.perf_counter() - started,
        )
        return handle

    def _snapshot(
        self,
        flat: FlatState,
        step: int,
        dp_rank: int,
        dp_world: int,
        metadata: dict[str, Any] | None,
        started: float,
        overlapped: SaveHandle | None = None,
        stall_s: float | None = None,
    ) -> SaveHandle:
        """Plan, take a slot, launch the copy and queue the persist; ``overlapped`` is the
        handle of an overlapped save (its copy is launched, not waited for)."""
        plan, tensors, sharded = self._plan(flat, dp_rank, dp_world)
        need = slice_nbytes(plan)
        if self._segments is not None:
            self._segments.sweep()  # the segments of exited ranks: their step is behind us
        slot = self._acquire_slot(need, step)
        try:
            buffer = slot.ensure_buffer(
                need, pin=any(t.is_cuda for t in tensors), segments=self._segments
            )
            copy = self._snapshotter.start(
                tensors, plan, buffer, overlapped.copy if overlapped else None
            )
            if overlapped is None:
                copy.wait()
        except (RuntimeError, MemoryError) as exc:
            self._release_slot(slot)
            if overlapped is not None:
                raise
            error = f"snapshot failed: {exc}"
            emit(self.listener, CheckpointFailed(step=step, error=error, dp_rank=dp_rank))
            handle = SaveHandle(step)
            handle._resolve(SaveResult(step, "failed", error=error))
            return handle
        handle = overlapped or SaveHandle(step)
        job = _Job(step, plan, flat.tree, slot, handle, copy, dict(metadata or {}), sharded)
        slot.holds(step, plan, sharded=sharded is not None)
        with self._cond:
            slot.step, slot.plan, slot.copy = step, plan, copy
            slot.state = SlotState.PENDING
            self._pending.append(job)
            self._cond.notify_all()
        emit(
            self.listener,
            CheckpointSaved(
                step=step,
                stall_s=time.perf_counter() - started if stall_s is None else stall_s,
                bytes=plan.slice_bytes,
                dp_rank=dp_rank,
                dp_world=dp_world,
            ),
        )
        return handle

    def _snapshot_planned(
        self,
        flat: FlatState,
        step: int,
        dp_rank: int,
        dp_world: int,
        metadata: dict[str, Any] | None,
        handle: SaveHandle,
        stall_s: float,
    ) -> None:
        """An overlapped save on the planner thread: any problem is that save's failed result
        (and fails its copy, so the optimizer-step guard does not wait for it forever)."""
        try:
            self._snapshot(flat, step, dp_rank, dp_world, metadata, 0.0, handle, stall_s)
        except Exception as exc:
            assert handle.copy is not None
            handle.copy.fail(exc)
            error = f"snapshot failed: {exc}"
            emit(self.listener, CheckpointFailed(step=step, error=error, dp_rank=dp_rank))
            handle._resolve(SaveResult(step, "failed", error=error))
        finally:
            with self._cond:
                self._planning -= 1
                self._cond.notify_all()

    def _wait_planned(self) -> None:
        """Block until every overlapped save handed to the planner thread has its slot."""
        with self._cond:
            while self._planning:
                self._cond.wait()

    def wait_snapshot(self) -> None:
        """Block until no overlapped snapshot copy still reads the state (safe to change it).
        CUDA copies are ordered before later work on the current stream instead of waited
        for on the host. A failed copy is not raised here: it is that save's failed result."""
        with self._cond:
            copies, self._copying = self._copying, []
        for copy in copies:
            try:
                copy.guard()
            except (RuntimeError, MemoryError):
                continue

    def guard(self, optimizer: torch.optim.Optimizer) -> Any:
        """Make ``optimizer.step()`` first wait for overlapped snapshot copies (the state an
        overlapped save reads changes only there); returns the hook's handle (``.remove()``)."""
        return optimizer.register_step_pre_hook(lambda *_: self.wait_snapshot())

    def prepare(self, state: Any, *, dp_rank: int = 0, dp_world: int = 1) -> None:
        """Allocate and touch a host buffer for states like ``state`` before the first save:
        fresh memory is slow to touch the first time (page faults; on some VMs the host backs
        it only then), so this keeps that cost out of the first save's stall."""
        plan, tensors, _ = self._plan(flatten(state), dp_rank, dp_world)
        with self._cond:
            if self._slots:
                return
            slot = Slot()
            self._slots.append(slot)
        try:
            buffer = slot.ensure_buffer(
                slice_nbytes(plan), pin=any(t.is_cuda for t in tensors), segments=self._segments
            )
            buffer.data.fill_(0)
        finally:
            self._release_slot(slot)

    def _plan(
        self, flat: FlatState, dp_rank: int, dp_world: int
    ) -> tuple[SavePlan, list[torch.Tensor], ShardedSave | None]:
        return plan_save(
            flat,
            dp_rank=dp_rank,
            dp_world=dp_world,
            files_per_rank=2 * self.writer_threads,
            min_file_bytes=self.min_file_bytes,
            parts=self.parts,
        )

    def _slot_limit(self, need: int) -> int:
        if self.memory_budget_bytes is None:
            return self.max_inflight
        return max(1, min(self.max_inflight, self.memory_budget_bytes // max(need, 1)))

    def _acquire_slot(self, need: int, step: int) -> Slot:
        dropped: _Job | None = None
        with self._cond:
            while True:
                if self._closed:
                    raise RuntimeError("checkpoint engine is closed")
                free = next((s for s in self._slots if s.state is SlotState.FREE), None)
                if free is not None:
                    free.state, free.step = SlotState.FILLING, None
                    slot = free
                    break
                if len(self._slots) < self._slot_limit(need):
                    slot = Slot()
                    self._slots.append(slot)
                    break
                if self._pending:
                    dropped = self._pending.popleft()
                    slot = dropped.slot
                    slot.state, slot.step = SlotState.FILLING, None
                    break
                self._cond.wait()
        if dropped is not None:
            # An overlapped copy must not go on writing into a buffer that is reused.
            with contextlib.suppress(RuntimeError, MemoryError):
                dropped.copy.wait()
            emit(self.listener, CheckpointDropped(step=dropped.step, superseded_by=step))
            dropped.handle._resolve(
                SaveResult(dropped.step, "dropped", error=f"superseded by step {step}")
            )
        return slot

    def _release_slot(self, slot: Slot) -> None:
        with self._cond:
            slot.state = SlotState.FREE
            self._cond.notify_all()

    # -- persisting ---------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if not self._pending:
                    return
                job = self._pending.popleft()
                job.slot.state = SlotState.PERSISTING
                self._persisting = True
            assert job.slot.buffer is not None
            result = self._persister.persist(
                job.step,
                job.plan,
                job.tree,
                job.slot.buffer.data,
                job.copy,
                job.metadata,
                job.sharded,
            )
            with self._cond:
                job.slot.state = SlotState.FREE
                self._cond.notify_all()
            job.handle._resolve(result)
            if result.committed and self.keep_last > 0:
                self._apply_retention()
            with self._cond:
                self._persisting = False
                self._cond.notify_all()

    def _apply_retention(self) -> None:
        """Runs after the save is reported durable, so deleting never delays it."""
        try:
            catalog.apply_retention(self.root, self.keep_last, self.listener)
        except OSError as exc:
            log.warning("checkpoint retention failed: %s", exc)

    # -- waiting, restoring, closing ----------------------------------------------------

    def wait_until_idle(self) -> None:
        """Block until every accepted save is persisted, failed or dropped."""
        with self._cond:
            while self._planning or self._pending or self._persisting:
                self._cond.wait()

    @property
    def policy(self) -> DirectIOPolicy:
        """How this engine's files are read and written (host restores read the volume so)."""
        return self._policy

    def latest_complete_step(self) -> int | None:
        return catalog.latest_complete_step(self.root)

    def host_snapshot(self, step: int) -> tuple[SavePlan, torch.Tensor] | None:
        """This replica's bytes of ``step`` as still held in a host buffer, or None. Valid
        until the next ``save`` (call both from the training thread). An overlapped copy still
        filling the buffer is waited for; a failed one leaves nothing to serve."""
        self._wait_planned()
        with self._cond:
            held = (s for s in self._slots if s.step == step and s.state is not SlotState.FILLING)
            slot = next(held, None)  # a slot's step is set with its buffer and plan
        if slot is None or slot.buffer is None or slot.plan is None:
            return None
        if slot.copy is not None:
            try:
                slot.copy.wait()
            except (RuntimeError, MemoryError):
                return None
        return slot.plan, slot.buffer.data

    def node_peers(
        self, step: int, *, sharded: bool
    ) -> contextlib.AbstractContextManager[list[PeerSegment]]:
        """The node's other segments claiming part of ``step`` (unchecked claims)."""
        if self._segments is None:
            return contextlib.nullcontext([])
        own = {s.buffer.path.name for s in self._slots if isinstance(s.buffer, SharedBuffer)}
        return self._segments.peers(step, sharded=sharded, exclude=own)

    def restore(
        self, step: int | None = None, into: Any = None, *, merge: bool = True
    ) -> tuple[int, Any]:
        """Load the newest intact checkpoint (at or before ``step``), falling back past bad ones.

        Returns ``(step, state)``; with ``into`` the tensors are loaded in place and ``into``
        is returned updated (``merge=False``: the checkpoint's structure holding them)."""
        return restore_checkpoint(
            self.root,
            step=step,
            into=into,
            io_threads=self.read_threads,
            policy=self._policy,
            listener=self.listener,
            merge=merge,
        )

    def close(self) -> None:
        """Finish pending saves, stop the worker and free the host buffers."""
        self.wait_until_idle()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._worker.join()
        self._planner.shutdown(wait=True)
        self._pool.shutdown(wait=True)
        self._snapshotter.close()
        for slot in self._slots:
            if slot.buffer is not None:
                slot.buffer.release()
        self._slots.clear()
        if self._segments is not None:
            self._segments.sweep()

    def __enter__(self) -> CheckpointEngine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
