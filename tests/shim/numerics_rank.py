"""One rank of a 3-replica job feeding the numerics monitor over a real gloo group.

``python -m tests.shim.numerics_rank RANK WORLD FLIP_RANK NAN_RANK [BACKEND DEVICE]``
(rendezvous from MASTER_ADDR and MASTER_PORT; default gloo on the CPU; tests/gpu runs
``cuda:gloo cuda``, a group that serves CUDA tensors only, as NCCL does, on the one GPU):
every rank builds the same seeded model; after step 7 rank
FLIP_RANK flips one bit of one parameter (a silent data corruption), and at step 3 rank
NAN_RANK's loss is NaN. A second monitor sees the same steps without the NaN. Prints one
JSON object: ``{"value": {"readings": [each window's reading], "clean": [steps the monitor
called known clean], "clean_without_nan": [the second monitor's]}}``, or the error the
windows raised and the file that raised it (``collectives_rank.attempt``).
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from datetime import timedelta

import torch
import torch.distributed as dist

from goodput.shim.collectives import barrier
from goodput.shim.numerics import NumericsMonitor
from tests.shim import fake_nccl
from tests.shim.collectives_rank import attempt


def main() -> None:
    rank, world, flip_rank, nan_rank = (int(a) for a in sys.argv[1:5])
    backend, device = (sys.argv[5], sys.argv[6]) if len(sys.argv) > 6 else ("gloo", "cpu")
    fake_nccl.register()
    dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=120))
    outcome = attempt(lambda: windows(rank, flip_rank, nan_rank, device))
    barrier(dist.new_group(backend="gloo"))  # leave together, as collectives_rank does
    dist.destroy_process_group()
    print(json.dumps(outcome, default=lambda o: {"slot": o.slot, "groups": o.groups}))


def windows(rank: int, flip_rank: int, nan_rank: int, device: str) -> dict[str, list]:
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 4).to(device)
    clean: list[int] = []
    clean_without_nan: list[int] = []
    monitor = NumericsMonitor(read_every=5, fingerprint_every=5, on_clean=clean.append)
    steady = NumericsMonitor(read_every=5, fingerprint_every=5, on_clean=clean_without_nan.append)
    readings = []
    for step in range(1, 16):
        finite = torch.tensor(1.0 + step + rank, device=device)  # step + 2 on 3 ranks
        loss = finite
        if step == 3 and rank == nan_rank:
            loss = torch.tensor(float("nan"), device=device)
        if step == 8 and rank == flip_rank:
            with torch.no_grad():
                words = model.weight.view(-1).view(torch.int32)
                words[5] ^= 1 << 30  # one bit of one weight, on one replica
        norm = torch.tensor(0.5, device=device)
        reading = monitor.observe(step, loss, norm, model.parameters)
        steady.observe(step, finite, norm, model.parameters)
        if reading is not None:
            readings.append(asdict(reading) | {"step": step})
    return {"readings": readings, "clean": clean, "clean_without_nan": clean_without_nan}


if __name__ == "__main__":
    main()
