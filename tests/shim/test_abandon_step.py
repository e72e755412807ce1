"""A survivor that leaves a broken gloo group frees it, so peers blocked on it fail at once.

Four real rank processes run all-reduces on gloo; rank 3 is killed (SIGKILL). A survivor
waiting on another survivor, not on the dead rank, fails only when that survivor's
connections close: with the failed step's frames kept, that was when its process exited
(here: after a minute), with them cleared it is at once."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

import pytest

from tests.processes import kill

pytestmark = pytest.mark.timeout(400)

WORLD = 4
RANK = """
import os, sys, time
from datetime import timedelta
import torch, torch.distributed as dist
from goodput.shim.group_abort import GroupAbort
from goodput.shim.inprocess import _abandon_step

class Job:
    def release_group(self): pass

rank, port = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", rank=rank, world_size=4, init_method=f"tcp://127.0.0.1:{port}",
                        timeout=timedelta(seconds=300))
tensor, done = torch.ones(1 << 16), 0
def step():
    dist.all_reduce(tensor)
try:
    while True:
        step()
        done += 1
        if rank == 3 and done == 20:
            os.kill(os.getpid(), 9)
except Exception as exc:
    print("failed", time.time(), flush=True)
    assert _abandon_step(Job(), exc, GroupAbort(), 10.0) == ""
    time.sleep(60)
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_every_survivor_fails_promptly_when_one_rank_of_four_dies() -> None:
    port = str(_free_port())
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, str(rank), port], stdout=subprocess.PIPE, text=True
        )
        for rank in range(WORLD)
    ]
    try:
        failed: list[float] = []
        for survivor in ranks[:3]:
            assert survivor.stdout is not None
            line = survivor.stdout.readline()  # blocks until it failed (or exited)
            assert line.startswith("failed"), f"a survivor ended without failing: {line!r}"
            failed.append(float(line.split()[1]))
        assert ranks[3].wait(timeout=10) == -9
        spread = max(failed) - min(failed)
        assert spread < 30, f"the last survivor failed {spread:.1f} s after the first"
    finally:
        kill(*ranks)


HOOKED_RANK = """
import os, sys
from datetime import timedelta
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from goodput.shim.group_abort import GroupAbort
from goodput.shim.inprocess import _abandon_step

rank, port = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", rank=rank, world_size=2, init_method=f"tcp://127.0.0.1:{port}",
                        timeout=timedelta(seconds=300))
# layers of 1 MiB, a bucket each: the first's collective is in flight when the next's hook runs
layers = [torch.nn.Linear(512, 512) for _ in range(4)]
ddp = DistributedDataParallel(torch.nn.Sequential(*layers), bucket_cap_mb=1)
ddp(torch.ones(1, 512)).sum().backward()  # one step together: DDP splits its buckets after it
loss = ddp(torch.ones(1, 512)).sum()  # (the ranks agree on the split in the next forward)
if rank == 1:
    print("ready", flush=True)
    sys.stdin.read()  # the peer that never answers: it leaves when the test closes its stdin
    os._exit(0)  # not through finalization, which can abort on a live gloo group (see below)
abort = GroupAbort()

def hook(_, bucket):
    # as the example's hook: a collective in flight whose future runs Python when it ends; the
    # Rejoin's abort lands before the next bucket's hook, which then finds no default group
    if bucket.index() == 1:
        abort.start()
        assert abort.wait(10) == ""
    world = dist.get_world_size()
    flat = bucket.buffer()
    gathered = torch.empty(world, flat.numel())
    work = dist.all_gather_single(gathered, flat.view(1, -1), async_op=True)
    return work.get_future().then(lambda _: gathered.mean(0))

ddp.register_comm_hook(None, hook)

class Job:
    def release_group(self):
        global ddp, loss
        ddp = loss = None

try:
    loss.backward()
except ValueError as exc:
    print("ready", flush=True)
    assert _abandon_step(Job(), exc, abort, 10.0) == ""
    print("left", flush=True)
    sys.stdin.read()  # alive (as a survivor rejoining) while its peer goes
# what is tested ends here; the aborted group is still referenced by the failed gather, and a
# gloo thread finishing it during the interpreter's finalization can abort the process
# ("terminate called without an active exception")
os._exit(0)
"""


def test_a_rank_leaves_a_group_whose_ddp_bucket_is_still_in_flight() -> None:
    """Rank 0's DDP bucket gathers from rank 1, which never takes part, when the Rejoin's
    abort empties torch's registry (as in the bench, the next bucket's hook then finds no
    group): the rank must leave at once, and live on when the peer goes and the old group's
    gather fails and runs its Python callback. Whether it deadlocked before depended on which
    holder freed the group last (the reducer, with the GIL: seen with py-spy in the bench);
    this test does not force that (it passed before the fix too):
    ``test_group_abort.py`` checks that the abort, not another holder, frees the group."""
    port = str(_free_port())
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", HOOKED_RANK, str(rank), port],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    leaver, peer = ranks
    try:
        assert leaver.stdout is not None and peer.stdout is not None and peer.stdin is not None
        assert peer.stdout.readline() == "ready\n"
        assert leaver.stdout.readline() == "ready\n"
        left = _line_within(leaver, 20)
        peer.stdin.close()  # the peer goes: the gather fails and its callback runs
        assert left == "left\n", "rank 0 did not leave the group (deadlocked freeing it)"
        assert peer.wait(timeout=30) == 0
        time.sleep(2)
        assert leaver.poll() is None, "rank 0 died when its old group's collective failed"
        assert leaver.stdin is not None
        leaver.stdin.close()
        assert leaver.wait(timeout=30) == 0
    finally:
        kill(*ranks)


def _line_within(process: subprocess.Popen, timeout_s: float) -> str:
    """The process's next line of output, or "" when none comes within ``timeout_s``."""
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.append(process.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout_s)
    return lines[0] if lines else ""
