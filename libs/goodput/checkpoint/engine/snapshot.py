"""The snapshot copy of a state into a host buffer, which may overlap with training.

Parameters and optimizer state change only at ``optimizer.step()``, so the copy of a save need
not block the training loop: it can run during the next forward/backward as long as it ends
before the tensors are next updated (the lazy-copy idea of DataStates-LLM). ``start`` launches
the copy and returns a ``PendingCopy``; ``PendingCopy.guard()`` is what must run before the
state changes, and ``PendingCopy.wait()`` what must run before the buffer is read.

CPU tensors are copied in chunks, in contiguous runs: the thread that launches the copy
copies the first run itself and a small pool the others (torch's copy releases the GIL, so
the runs really run in parallel). The threads, the launching one included, are the host's
cores shared among the ranks on it (:func:`copy_threads_for`): a copy is memory bound, so
more threads than cores only queue for them, and on a loaded host every hand-over to a pool
thread and back waits for a core again (docs/BENCHMARKS.md, *Sharded across nodes*). An
overlapped save launches its copy on the engine's planner thread, so the training thread
still copies nothing. CUDA tensors are
copied device-to-host into the page-locked buffer with non-blocking copies on a side stream
that first waits for the current stream; the copy's end is a CUDA event, so ``guard()`` only
makes the training stream wait for it (no host synchronize) and ``wait()`` synchronizes on it.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from goodput.checkpoint.engine.buffers import HostBuffer, byte_view
from goodput.checkpoint.engine.node_segments import SharedBuffer
from goodput.checkpoint.engine.plan import SavePlan

COPY_CHUNK_BYTES = 64 << 20
#: the most threads one rank's copy uses: a copy is memory bound, more add no bandwidth
MAX_COPY_THREADS = 8


def copy_threads_for(cores: int, local_ranks: int) -> int:
    """Threads for one rank's copy when ``local_ranks`` ranks share ``cores`` cores: an equal
    share of the cores (at least 1, at most :data:`MAX_COPY_THREADS`), so the ranks' copies
    together ask for no more cores than the host has (one each where they outnumber them)."""
    return max(1, min(cores // max(1, local_ranks), MAX_COPY_THREADS))


def default_copy_threads(local_ranks: int = 1) -> int:
    """:func:`copy_threads_for` the cores this process may run on."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return copy_threads_for(cores, local_ranks)


def _set_event() -> threading.Event:
    event = threading.Event()
    event.set()
    return event


@dataclass(eq=False)
class PendingCopy:
    """A snapshot copy in flight: CPU chunk futures and one CUDA event per device.

    A ``deferred()`` copy is handed out before it is launched (the engine plans an overlapped
    save off the training thread): every wait first waits for the launch, and a launch that
    failed is raised as the RuntimeError the waits already stand for a failed copy.
    """

    futures: list[Future[None]] = field(default_factory=list)
    events: list[torch.cuda.Event] = field(default_factory=list)
    #: per CUDA device, the point of the training thread's current stream the copy waits for:
    #: a deferred copy is launched on the planner thread, whose current stream is its own
    after: dict[int, torch.cuda.Event] = field(default_factory=dict)
    _done: bool = False
    _launched: threading.Event = field(default_factory=_set_event)
    _error: RuntimeError | None = None

    @classmethod
    def deferred(cls, tensors: list[torch.Tensor]) -> PendingCopy:
        """A copy of ``tensors`` to be launched later, on another thread: call it on the
        thread (and under the stream) that produced them, which it marks."""
        return cls(_launched=threading.Event(), after=mark_current_streams(tensors))

    def fail(self, exc: BaseException) -> None:
        """The copy will never be launched: its waits raise instead of blocking forever."""
        self._error = RuntimeError(f"snapshot failed: {exc}")
        self._launched.set()

    def _await_launch(self) -> None:
        self._launched.wait()
        if self._error is not None:
            raise self._error

    def guard(self) -> None:
        """Block until the state may change: CPU copies finish, CUDA streams are ordered."""
        self._await_launch()
        for future in self.futures:
            future.result()
        for event in self.events:
            torch.cuda.current_stream(event.device).wait_event(event)

    def wait(self) -> None:
        """Block until every byte is in the host buffer; re-raises a failed copy's error."""
        if self._done:
            return
        self._await_launch()
        for future in self.futures:
            future.result()
        for event in self.events:
            event.synchronize()
        self._done = True

    def done(self) -> bool:
        if self._done or self._error is not None:
            return True
        return (
            self._launched.is_set()
            and all(future.done() for future in self.futures)
            and all(event.query() for event in self.events)
        )


def mark_current_streams(tensors: list[torch.Tensor]) -> dict[int, torch.cuda.Event]:
    """An event recorded on this thread's current stream of every CUDA device ``tensors``
    live on: what produced them so far, and nothing queued after (a training loop on its own
    stream would otherwise race the copy launched from another thread)."""
    marks: dict[int, torch.cuda.Event] = {}
    for tensor in tensors:
        if tensor.is_cuda:
            index = tensor.device.index if tensor.device.index is not None else 0
            if index not in marks:
                event = torch.cuda.Event()
                event.record(torch.cuda.current_stream(index))
                marks[index] = event
    return marks


def _copy_pieces(pieces: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    for source, target in pieces:
        target.copy_(source)


def _copied_here(pieces: list[tuple[torch.Tensor, torch.Tensor]]) -> Future[None]:
    """Copy ``pieces`` on this thread; the outcome as a finished future, waited for (and a
    failure raised) like the pool's."""
    done: Future[None] = Future()
    try:
        _copy_pieces(pieces)
    except Exception as exc:  # raised by the waits, after the pool's runs (listed first)
        done.set_exception(exc)
    else:
        done.set_result(None)
    return done


class Snapshotter:
    """Copies the planned slice of a state into a host buffer, in the background if asked."""

    def __init__(self, copy_threads: int | None = None) -> None:
        #: the threads of a CPU copy, the launching one included (the pool has one fewer)
        self.copy_threads = copy_threads or default_copy_threads()
        self._pool = (
            ThreadPoolExecutor(self.copy_threads - 1, thread_name_prefix="goodput-ckpt-copy")
            if self.copy_threads > 1
            else None
        )
        self._streams: dict[int, torch.cuda.Stream] = {}
        self._lock = threading.Lock()

    def _side_stream(self, index: int) -> torch.cuda.Stream:
        with self._lock:
            if index not in self._streams:
                self._streams[index] = torch.cuda.Stream(device=index)
            return self._streams[index]

    def start(
        self,
        tensors: list[torch.Tensor],
        plan: SavePlan,
        buffer: HostBuffer | SharedBuffer,
        pending: PendingCopy | None = None,
    ) -> PendingCopy:
        """Launch the copy of ``plan``'s slice of ``tensors`` into ``buffer``; returns once
        this thread's own run of CPU chunks is copied (the pool's runs and CUDA copies may
        still be in flight: wait on the result).

        ``pending`` is a ``PendingCopy.deferred()`` already handed out, launched by this call.
        """
        base = plan.slice_start
        cpu_pieces: list[tuple[torch.Tensor, torch.Tensor]] = []
        cuda_pieces: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        for tensor, entry in zip(tensors, plan.tensors, strict=True):
            lo = max(plan.slice_start, entry.offset)
            hi = min(plan.slice_end, entry.offset + entry.nbytes)
            if lo >= hi:
                continue
            source = byte_view(tensor)[lo - entry.offset : hi - entry.offset]
            target = buffer.data[lo - base : hi - base]
            if tensor.is_cuda:
                index = tensor.device.index if tensor.device.index is not None else 0
                cuda_pieces.setdefault(index, []).append((source, target))
                continue
            for start in range(0, hi - lo, COPY_CHUNK_BYTES):
                end = min(start + COPY_CHUNK_BYTES, hi - lo)
                cpu_pieces.append((source[start:end], target[start:end]))
        pending = pending if pending is not None else PendingCopy()
        for index, pieces in cuda_pieces.items():
            pending.events.append(self._start_cuda(index, pieces, pending.after.get(index)))
        if cpu_pieces:
            # Contiguous runs per thread: each thread streams through its own memory range;
            # the pool's runs are handed over first, then this thread copies the first run.
            per_thread = -(-len(cpu_pieces) // self.copy_threads)
            if self._pool is not None:
                for first in range(per_thread, len(cpu_pieces), per_thread):
                    run = cpu_pieces[first : first + per_thread]
                    pending.futures.append(self._pool.submit(_copy_pieces, run))
            pending.futures.append(_copied_here(cpu_pieces[:per_thread]))
        pending._launched.set()
        return pending

    def _start_cuda(
        self,
        index: int,
        pieces: list[tuple[torch.Tensor, torch.Tensor]],
        after: torch.cuda.Event | None,
    ) -> torch.cuda.Event:
        """Copy on the device's side stream, once the producer (``after``: a mark from the
        training thread; else this thread's current stream) has written the state."""
        stream = self._side_stream(index)
        if after is not None:
            stream.wait_event(after)
        else:
            stream.wait_stream(torch.cuda.current_stream(index))
        with torch.cuda.stream(stream):
            for source, target in pieces:
                # The source may be a temporary (a non-contiguous tensor's contiguous copy):
                # keep its memory from being reused before the side stream has read it.
                source.record_stream(stream)
                target.copy_(source, non_blocking=True)
            event = torch.cuda.Event()
            event.record(stream)
        return event

    def copy(self, tensors: list[torch.Tensor], plan: SavePlan, buffer: HostBuffer) -> None:
        """The blocking form: returns once every byte is in ``buffer``."""
        self.start(tensors, plan, buffer).wait()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
