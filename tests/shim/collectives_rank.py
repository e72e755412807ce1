"""One rank of a job calling each of goodput's collectives on the group it is told to form.

``python -m tests.shim.collectives_rank BACKEND RANK WORLD`` (rendezvous from MASTER_ADDR and
MASTER_PORT; ``run_ranks`` starts a whole group) prints one JSON object: the device types the group serves and, for each call,
its value or the error it raised with the file that raised it, so a test can tell torch's
dispatch refusing a tensor from torch.cuda refusing to make one. Used by tests/shim (CPU) and
tests/gpu (a real GPU).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from goodput.shim import collectives
from goodput.shim.agree import agree_range, any_rank
from tests.examples.launch import free_port
from tests.shim import fake_nccl

REPO = Path(__file__).resolve().parents[2]

#: what each call returns on two ranks where rank 0 votes yes and rank r offers step 10 + r
AGREED = {
    "any_rank": [True, False],
    "agree_range": [10, 11],
    "max": [1, 7],
    "barrier": None,
    "broadcast": "from 0",
}


def run_ranks(backend: str, world: int) -> list[dict[str, Any]]:
    """Start ``world`` real rank processes forming a ``backend`` group; their outcomes."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.shim.collectives_rank", backend, str(rank), str(world)],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
        )
        for rank in range(world)
    ]
    outputs = [p.communicate(timeout=240)[0] for p in processes]
    assert [p.returncode for p in processes] == [0] * world
    return [json.loads(out.decode().strip().splitlines()[-1]) for out in outputs]


def attempt(call: Callable[[], Any]) -> dict[str, Any]:
    try:
        return {"value": call()}
    except Exception as error:  # AssertionError included: torch.cuda raises it without CUDA
        return {
            "error": f"{type(error).__name__}: {error}",
            "raised_in": traceback.extract_tb(error.__traceback__)[-1].filename,
        }


def main() -> None:
    backend, rank, world = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    fake_nccl.register()
    if torch.cuda.is_available():
        torch.cuda.set_device(0)  # every rank on the one GPU, as gloo allows (NCCL does not)
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=120))
    outcomes = {
        "served": sorted(collectives.served_device_types()),
        "device": attempt(lambda: str(collectives.collective_device())),
        "any_rank": attempt(lambda: any_rank(rank == 0, False)),
        "agree_range": attempt(lambda: list(agree_range(10 + rank))),
        "max": attempt(lambda: collectives.all_reduce_ints([rank, 7], dist.ReduceOp.MAX)),
        "barrier": attempt(collectives.barrier),
        "broadcast": attempt(lambda: collectives.broadcast_object(f"from {rank}", src=0)),
    }
    # leave together over a gloo group (a rank exiting while a peer's gloo threads still
    # talk to it aborts the peer), which every backend here can form beside its own
    collectives.barrier(dist.new_group(backend="gloo"))
    dist.destroy_process_group()
    print(json.dumps(outcomes), flush=True)


if __name__ == "__main__":
    main()
