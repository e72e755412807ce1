"""Leaving a broken process group in bounded time: a real gloo group is aborted and a new one
forms in the same process; an abort that never returns (``WedgedAbort``, a FAKE standing in
for ``ncclCommAbort`` on a wedged communicator, which needs a GPU to happen for real) is
reported by its deadline; the Rejoin command itself starts the abort; a gloo group's abort
cuts its connections, so a survivor waiting on a survivor fails at once."""

from __future__ import annotations

import gc
import json
import os
import select
import socket
import threading
import time
import weakref
from collections.abc import Iterator
from datetime import timedelta

import msgspec
import pytest
import torch.distributed as dist

from goodput import schemas
from goodput.bus.embedded import free_port
from goodput.shim.group_abort import GroupAbort
from goodput.shim.inprocess import RejoinMailbox
from tests.processes import kill
from tests.shim.gloo_cut_rank import HOLD_S, start_ranks


class WedgedAbort:
    """FAKE abort that never returns, as ``ncclCommAbort`` on a communicator whose proxy
    thread or kernel is wedged: it blocks until the test releases it, and counts its calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.release = threading.Event()

    def __call__(self) -> None:
        self.calls += 1
        self.release.wait()


@pytest.fixture
def wedged() -> Iterator[WedgedAbort]:
    abort = WedgedAbort()
    yield abort
    abort.release.set()  # let the daemon thread end


def _gloo_group() -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{free_port()}",
        rank=0,
        world_size=1,
        timeout=timedelta(seconds=30),
    )


def test_a_real_group_is_aborted_and_a_new_one_forms_in_the_same_process() -> None:
    _gloo_group()
    try:
        assert GroupAbort().wait(30) == ""
        assert not dist.is_initialized()
        _gloo_group()  # torch's registry was cleared: the next rendezvous is possible
        assert dist.get_world_size() == 1
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_the_aborted_group_is_freed_by_the_release_not_by_whoever_held_it_last() -> None:
    """A DDP reducer freeing the group holds the GIL, and deadlocks when a collective is still
    in flight (``goodput.shim.group_abort``): the abort keeps the group until ``release``."""
    _gloo_group()
    group = weakref.ref(dist.group.WORLD)
    abort = GroupAbort()
    assert abort.wait(30) == ""
    gc.collect()
    assert group() is not None, "torch's registry is empty: only the abort holds the group"
    abort.release().join(10)
    gc.collect()
    assert group() is None


def test_an_abort_that_never_returns_is_reported_by_its_deadline(wedged: WedgedAbort) -> None:
    started = time.monotonic()
    why = GroupAbort(wedged).wait(0.5)
    assert time.monotonic() - started < 10
    assert why == (
        "its process group abort did not return within 0.5 s (a wedged communicator); "
        "this process cannot form a new group"
    )
    assert wedged.calls == 1


def test_the_deadline_counts_from_the_start_of_the_abort(wedged: WedgedAbort) -> None:
    # started by the Rejoin on the link's thread, waited for by the loop once its step unwound
    abort = GroupAbort(wedged)
    abort.start()
    time.sleep(0.6)
    started = time.monotonic()
    assert "within 0.5 s" in abort.wait(0.5)
    assert time.monotonic() - started < 0.5


def test_an_abort_that_fails_says_why() -> None:
    def refuse() -> None:
        raise RuntimeError("NCCL error: unhandled system error")

    assert GroupAbort(refuse).wait(10) == (
        "its process group abort failed: NCCL error: unhandled system error"
    )


def test_the_abort_runs_once_whoever_starts_it(wedged: WedgedAbort) -> None:
    abort = GroupAbort(wedged)
    threads = [threading.Thread(target=abort.start) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wedged.release.set()
    assert abort.wait(10) == "" and wedged.calls == 1


def test_an_accepted_rejoin_starts_the_armed_abort_and_an_old_one_does_not(
    wedged: WedgedAbort,
) -> None:
    mailbox = RejoinMailbox(attempt=2)
    abort = mailbox.arm(GroupAbort(wedged))
    old = schemas.Rejoin(job="j", attempt=2, master_addr="h", master_port=1, world_size=2)
    assert not mailbox.offer(old) and not abort.started
    assert mailbox.offer(msgspec.structs.replace(old, attempt=3)) and abort.started


@pytest.mark.timeout(300)
def test_a_gloo_abort_fails_a_survivor_waiting_on_the_aborting_survivor() -> None:
    """Rank 2 dies during an all-reduce; rank 1 fails and aborts its groups; rank 0, waiting
    on rank 1, fails as soon as rank 1's connections are cut. torch's gloo abort alone leaves
    it waiting until rank 1's process ends (HOLD_S) or the group times out."""
    ranks = start_ranks(cut=True)
    try:
        out, err = ranks[0].communicate(timeout=240)
        assert ranks[0].returncode == 0, err.decode(errors="replace")[-3000:]
        zero = json.loads(out.decode().splitlines()[-1])
        assert zero["failed_after_s"] < HOLD_S / 2, zero  # a bound, not a speed requirement
        # rank 1 says how its abort ended once the abort call returned: after its cut freed
        # rank 0, so it is waited for, not killed first
        assert ranks[1].stdout is not None
        ready, _, _ = select.select([ranks[1].stdout], [], [], 60)
        assert ready, "rank 1 never said how its abort ended"
        one = json.loads(ranks[1].stdout.readline())
    finally:
        kill(*ranks)
    assert one["abort"] == "", one


def test_a_wedged_abort_still_cuts_the_groups_connections(wedged: WedgedAbort) -> None:
    """The cut comes first: an abort that never returns must not leave a collective blocked
    on a peer (the peer's end sees the connection closed at once)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        ours = socket.create_connection(server.getsockname())
        theirs, _ = server.accept()
        with ours, theirs:
            abort = GroupAbort(wedged, sockets=frozenset({os.fstat(ours.fileno()).st_ino}))
            assert "within 0.5 s" in abort.wait(0.5)
            assert wedged.calls == 1
            theirs.settimeout(10)
            assert theirs.recv(1) == b""
