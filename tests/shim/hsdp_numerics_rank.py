"""One rank of a 4-rank HSDP job (2 replicas x 2 shards, gloo, CPU) feeding the numerics
monitor: ``python -m tests.shim.hsdp_numerics_rank RANK FLIP_RANK`` (rendezvous from
MASTER_ADDR and MASTER_PORT). After step 7 rank FLIP_RANK flips one bit of its local shard
of the first weight. Prints one JSON line: each window's reading, and the steps called
known clean."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from goodput.shim.numerics import NumericsMonitor, replicated

WORLD = 4


def main() -> None:
    rank, flip_rank = int(sys.argv[1]), int(sys.argv[2])
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=timedelta(seconds=120))
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Linear(8, 4))
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    fully_shard(model, mesh=mesh)  # a 2-D mesh: HSDP (Replicate, Shard(0))
    clean: list[int] = []
    monitor = NumericsMonitor(read_every=5, fingerprint_every=5, on_clean=clean.append)
    parameters = replicated(model)
    readings = []
    for step in range(1, 16):
        if step == 8 and rank == flip_rank:
            with torch.no_grad():
                words = model[0].weight.to_local().view(-1).view(torch.int32)
                words[3] ^= 1 << 30  # one bit of this replica's shard
        reading = monitor.observe(step, torch.tensor(2.0), torch.tensor(0.5), parameters)
        if reading is not None:
            readings.append(asdict(reading) | {"step": step})
    dist.barrier()
    dist.destroy_process_group()
    out = {"readings": readings, "clean": clean}
    print(json.dumps(out, default=lambda o: {"slot": o.slot, "groups": o.groups}))


if __name__ == "__main__":
    main()
