"""FAKE: a process-group backend named "fake_nccl" that, like NCCL, serves CUDA tensors only.

It is registered with ``dist.Backend.register_backend(..., devices=["cuda"])``, so the group
has a backend for CUDA and none for the CPU, exactly as an NCCL group: torch's own dispatch
refuses a CPU tensor ("No backend type associated with device type cpu") before the backend
sees it, the very error a real NCCL group raises. The transport behind it is real gloo (which
moves CUDA tensors through the host), so on a machine with a GPU the collectives the fake
does accept really run between the ranks; on a CPU-only torch no tensor can reach it, which
is the point: only the device check is faked, nothing is answered on the ranks' behalf.
"""

from __future__ import annotations

from datetime import timedelta

import torch.distributed as dist

NAME = "fake_nccl"


def _create(
    store: dist.Store, rank: int, world_size: int, timeout: timedelta
) -> dist.ProcessGroupGloo:
    return dist.ProcessGroupGloo(store, rank, world_size, timeout)


def register() -> str:
    """Register the fake (again is harmless: torch overwrites the same entries) and return
    the name to give ``init_process_group``. It does not claim CUDA's default backend."""
    dist.Backend.register_backend(NAME, _create, devices=["cuda"])
    return NAME
