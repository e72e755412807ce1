"""One rank of three in a gloo job where a survivor waits on a survivor.

``python -m tests.shim.gloo_cut_rank RANK CUT`` (rendezvous from MASTER_ADDR and MASTER_PORT;
:func:`start_ranks` starts the three). They form the world group and a group of ranks 0 and 1.
Rank 2 dies (SIGKILL) instead of joining an all-reduce of the world: rank 1, in that
all-reduce, fails and aborts its groups with :class:`~goodput.shim.group_abort.GroupAbort` —
given both groups' connections when CUT is 1 — then keeps its process (and the aborted groups)
alive, as a rank waiting for its Rejoin does. Rank 0 is in an all-reduce of the pair, waiting
on rank 1, a live peer that will never join it (as a survivor of a ring all-reduce waits on a
neighbour that failed): it prints how long after that all-reduce began it failed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from goodput.shim.group_abort import GroupAbort
from goodput.shim.group_sockets import opened_by
from tests.examples.launch import free_port

REPO = Path(__file__).resolve().parents[2]
#: how long rank 1 lives on with its aborted group (a rank waiting for its Rejoin)
HOLD_S = 60.0


def start_ranks(cut: bool) -> list[subprocess.Popen]:
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    return [
        subprocess.Popen(
            [sys.executable, "-m", "tests.shim.gloo_cut_rank", str(rank), str(int(cut))],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for rank in range(3)
    ]


def main() -> None:
    rank, cut = int(sys.argv[1]), sys.argv[2] == "1"
    _, world = opened_by(
        lambda: dist.init_process_group(
            "gloo", rank=rank, world_size=3, timeout=timedelta(seconds=300)
        )
    )
    pair, pair_sockets = opened_by(lambda: dist.new_group([0, 1]))
    buffer = torch.ones(1 << 10)
    dist.all_reduce(buffer)
    if rank < 2:
        dist.all_reduce(buffer, group=pair)
    if rank == 2:
        time.sleep(0.5)  # the others are in their next all-reduce
        os.kill(os.getpid(), signal.SIGKILL)
    started = time.monotonic()
    try:
        dist.all_reduce(buffer, group=pair if rank == 0 else None)
    except RuntimeError as exc:
        failed_after_s = time.monotonic() - started
        error = str(exc).splitlines()[0][:120]
    else:
        raise AssertionError("the peer waited on is not in it: the all-reduce cannot succeed")
    if rank == 0:
        print(json.dumps({"rank": 0, "failed_after_s": failed_after_s, "error": error}), flush=True)
        # leave without the interpreter's finalization: it frees the failed gloo groups, whose
        # worker may still be tearing down (one run aborted: "terminate called without an
        # active exception", SIGABRT), as in fsdp_job.py
        os._exit(0)
    sockets = world | pair_sockets if cut else frozenset()
    why = GroupAbort(sockets=sockets).wait(30)
    print(json.dumps({"rank": 1, "abort": why, "error": error}), flush=True)
    time.sleep(HOLD_S)


if __name__ == "__main__":
    main()
