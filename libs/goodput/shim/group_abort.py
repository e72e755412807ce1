"""Leaving a broken process group in bounded time: the first half of an in-process restart.

A peer's death does not fail an NCCL collective: the kernel spins waiting for it, and the
rank's thread waits on the kernel. Only aborting the communicators (``ncclCommAbort``) stops
it; then the blocked call returns or raises and the rank can unwind. The abort runs on its own
thread, started when the step fails or when the ``Rejoin`` arrives (whichever is first: a rank
stuck in a collective is freed by the command), and the rank waits for it with a deadline. An
abort that does not return (a wedged communicator, a driver call that never comes back) must
not leave the rank half-rejoined: it says why (:meth:`GroupAbort.wait`), answers the Rejoin
with that reason and exits, and the controller decides a cold restart naming it.

The aborted groups are also *freed* here, never by whatever else held them. Freeing a gloo
group joins its worker threads, and a worker still running a collective (a DDP bucket whose
peer has not answered) finishes it with the work future's callbacks, which take the GIL when
they are Python (a DDP comm hook's ``then``). torch frees a group without the GIL only when
the last reference is a Python ``ProcessGroup``; DDP's C++ ``Reducer`` frees it *holding* the
GIL, so a rank dropping its DDP wrapper after an abort (which emptied torch's registry, so the
reducer held the last reference) deadlocked: seen with py-spy on a rank that never answered its
``Rejoin`` (main thread in ``~Reducer`` → ``~ProcessGroupGloo`` → ``thread::join``, the gloo
worker in ``setError`` → the hook's callback → ``gil_scoped_acquire``). :class:`GroupAbort`
holds every group from its creation, so no other holder is ever the last, and
:meth:`GroupAbort.release` drops them on a thread of its own, without the GIL, once the job let
go of them: the rank goes on rejoining while the old group's last collectives end (a peer's
connection closing, or the group's timeout) and its connections close.

A gloo group is not aborted by torch at all (a no-op): its connections are cut instead
(:mod:`goodput.shim.group_sockets`), which fails every collective waiting on this rank, here
and on its peers, as a peer's death would.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from goodput.shim.group_sockets import cut

log = logging.getLogger(__name__)

#: torch >= 2.5. No public call aborts every group of the process *and* forgets them (checked
#: in torch 2.13): ``ProcessGroup.abort()`` (public, on every backend) aborts one group but
#: leaves it registered, so ``init_process_group`` refuses the next one, and aborting the NCCL
#: groups one by one can deadlock (pytorch#119797); ``destroy_process_group`` shuts down
#: gracefully and may wait on the dead peer. ``_abort_process_group`` aborts them together
#: inside one NCCL group call and clears torch's registry; torch's own ``shrink_group`` uses it.
_ABORT_ALL: Callable[[], None] | None = getattr(distributed_c10d, "_abort_process_group", None)


def abort_groups() -> None:
    """Abort every process group of this process (NCCL communicators, gloo connections), so
    peers blocked on this rank fail now and a fresh group can be formed in this process."""
    if not dist.is_initialized():
        return
    if _ABORT_ALL is None:
        raise RuntimeError(
            f"torch {torch.__version__} cannot abort a process group "
            "(in-process restart needs torch >= 2.5)"
        )
    _ABORT_ALL()


def process_groups() -> list[dist.ProcessGroup]:
    """Every process group of this process (torch's registry; none before the first)."""
    if not dist.is_initialized():
        return []
    # private: torch has no public list of a process's groups (checked in torch 2.13)
    return list(distributed_c10d._world.pg_map)


class GroupAbort:
    """One abort of this process's groups, on a daemon thread, waited on with a deadline; it
    holds the groups from its creation until :meth:`release` (see the module docstring).

    :meth:`start` is idempotent and may be called from any thread (the training loop's, the bus
    link's); ``abort`` defaults to :func:`abort_groups`. ``sockets`` are the groups'
    connections (:func:`goodput.shim.group_sockets.opened_by`), cut before ``abort`` is called
    (an abort that hangs must not keep a collective blocked on a peer).
    """

    def __init__(
        self, abort: Callable[[], None] = abort_groups, sockets: frozenset[int] = frozenset()
    ) -> None:
        self._abort = abort
        self._sockets = sockets
        self._held = process_groups()
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = 0.0
        self._error = ""

    @property
    def started(self) -> bool:
        return self._thread is not None

    def start(self) -> None:
        with self._lock:
            if self._thread is not None:
                return
            self._started = time.monotonic()
            self._thread = threading.Thread(target=self._run, name="group-abort", daemon=True)
            self._thread.start()

    def wait(self, timeout_s: float) -> str:
        """Start the abort if needed and wait up to ``timeout_s`` from its start: "" once the
        groups are aborted, else why this rank cannot rejoin (the abort hangs or failed)."""
        self.start()
        remaining = max(0.0, self._started + timeout_s - time.monotonic())
        if not self._done.wait(remaining):
            return (
                f"its process group abort did not return within {timeout_s:g} s "
                "(a wedged communicator); this process cannot form a new group"
            )
        return self._error

    def release(self) -> threading.Thread:
        """Drop this hold on the groups (after the job dropped its own: DDP) on a daemon
        thread, where freeing them waits for their last collectives without the GIL; the
        thread ends once they are freed."""
        held, self._held = self._held, []
        thread = threading.Thread(target=held.clear, name="group-release", daemon=True)
        thread.start()
        return thread

    def _run(self) -> None:
        try:
            # first: what frees a gloo collective blocked on a peer, whatever the abort does
            if self._sockets:
                log.info("cut %d connection(s) of the aborted group", cut(self._sockets))
            self._abort()
        except Exception as exc:  # the rank reports it (a failed abort is a failed restart)
            log.exception("the process group abort failed")
            self._error = f"its process group abort failed: {exc}"
        finally:
            self._done.set()
