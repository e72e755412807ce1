"""goodput's collectives put their tensors on the device the group's backend serves.

The seam: NCCL cannot run on this CPU-only torch, but what makes NCCL refuse a CPU tensor is
not NCCL — it is torch's dispatch, which looks up the group's backend for the tensor's device
type and finds none for "cpu" ("No backend type associated with device type cpu"). A group
whose only backend is registered for "cuda" gets the same refusal from the same code. The
named fake ``fake_nccl`` (tests/shim/fake_nccl.py) is such a group: real gloo underneath,
registered for CUDA only, so a CPU tensor is refused exactly as NCCL refuses it, and torch
builds no CUDA tensor here. A collective that offers it a CPU tensor fails with the dispatch
error (today's ``any_rank`` did: it built a CPU tensor whatever the group); one that chooses
the device the group serves asks ``torch.cuda`` for the current device, which on this torch
raises from torch/cuda — the test tells the two apart by where the error was raised. On a
machine with a GPU the same calls complete through gloo with CUDA tensors (tests/gpu runs
them, and real NCCL).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist

from goodput.shim.collectives import collective_device, served_device_types
from tests.shim import fake_nccl
from tests.shim.collectives_rank import AGREED, run_ranks

DISPATCH_REFUSAL = "No backend type associated with device type cpu"


@pytest.fixture
def one_rank_group() -> Iterator[None]:
    """Lets a test form a one-rank default group in this process, and removes it after."""
    fake_nccl.register()
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.parametrize(
    ("backend", "served", "device"),
    [
        ("gloo", ["cpu", "cuda"], "cpu"),
        ("cpu:gloo,cuda:fake_nccl", ["cpu", "cuda"], "cpu"),  # mixed: votes stay on the host
        ("cuda:gloo", ["cuda"], "cuda"),  # a real gloo group told to serve CUDA only
        ("fake_nccl", ["cuda"], "cuda"),
    ],
)
def test_the_device_is_one_the_group_serves(
    one_rank_group: None, backend: str, served: list[str], device: str
) -> None:
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    assert sorted(served_device_types()) == served
    if device == "cpu":
        assert collective_device() == torch.device("cpu")
    elif torch.cuda.is_available():
        assert collective_device() == torch.device("cuda", torch.cuda.current_device())
    else:
        with pytest.raises((AssertionError, RuntimeError)) as raised:
            collective_device()
        assert "torch/cuda" in raised.traceback[-1].path.as_posix()


def test_the_fake_refuses_a_cpu_tensor_as_nccl_does(one_rank_group: None) -> None:
    dist.init_process_group(fake_nccl.NAME, store=dist.HashStore(), rank=0, world_size=1)
    with pytest.raises(RuntimeError, match=DISPATCH_REFUSAL):
        dist.all_reduce(torch.zeros(1))


def test_no_collective_offers_an_nccl_like_group_a_cpu_tensor() -> None:
    """Two ranks on the fake: every vote, agreement, barrier and broadcast reaches for the
    rank's CUDA device, none is refused for offering a CPU tensor."""
    for rank, outcome in enumerate(run_ranks(fake_nccl.NAME, 2)):
        assert outcome["served"] == ["cuda"]
        for call, agreed in AGREED.items():
            result = outcome[call]
            if torch.cuda.is_available():
                assert result == {"value": agreed}, (rank, call, result)
            else:
                assert DISPATCH_REFUSAL not in result["error"], (rank, call, result)
                assert "torch/cuda" in result["raised_in"].replace(os.sep, "/"), (call, result)


def test_collectives_between_gloo_ranks_agree() -> None:
    for rank, outcome in enumerate(run_ranks("gloo", 2)):
        assert outcome["device"] == {"value": "cpu"}
        for call, agreed in AGREED.items():
            assert outcome[call] == {"value": agreed}, (rank, call)
