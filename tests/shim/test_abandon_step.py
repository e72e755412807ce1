"""A survivor that leaves a broken gloo group frees it, so peers blocked on it fail at once.

Four real rank processes run all-reduces on gloo; rank 3 is killed (SIGKILL). A survivor
waiting on another survivor, not on the dead rank, fails only when that survivor's
connections close: with the failed step's frames kept, that was when its process exited
(here: after a minute), with them cleared it is at once."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

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
        for rank in ranks:
            rank.kill()
            rank.wait()
