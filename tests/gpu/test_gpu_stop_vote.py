"""The pipelined stop vote on a real GPU: the CUDA ballot makes no host sync.

torch's sync debug mode ("error") raises at any synchronizing CUDA call torch makes — a
blocking copy to or from the device, ``.item()``, a stream or device synchronize. Under it,
NCCL ballots (one rank: the one-GPU machine cannot hold two NCCL ranks) are launched while
the device still runs queued work, then read once the device has passed them — as a step's
end reads the previous step's ballot. The vote's agreement across ranks is
tests/shim/test_stop_vote.py's (gloo, real processes).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from goodput.shim.stop_vote import _CudaBallot
from tests.examples.launch import free_port
from tests.gpu.kit import GPU

pytestmark = GPU


@pytest.fixture
def nccl_group() -> Iterator[None]:
    torch.cuda.set_device(0)
    dist.init_process_group(
        "nccl",
        init_method=f"tcp://127.0.0.1:{free_port()}",
        rank=0,
        world_size=1,
        timeout=timedelta(seconds=60),
        device_id=torch.device("cuda", 0),
    )
    yield
    dist.destroy_process_group()


def test_a_cuda_ballot_is_launched_and_read_without_a_host_sync(nccl_group: None) -> None:
    ballot = _CudaBallot(torch.device("cuda", 0))
    ballot.launch(False)  # the communicator's first collective sets it up: outside the check
    torch.cuda.synchronize()
    assert ballot.result() is False
    busy = torch.randn(4096, 4096, device="cuda")
    answers = []
    for flag in (False, True, False, True):
        torch.cuda.set_sync_debug_mode("error")
        try:
            _ = busy @ busy  # the step's work, still queued when the ballot is launched
            ballot.launch(flag)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()  # the device passes the ballot during the next step
        torch.cuda.set_sync_debug_mode("error")
        try:
            assert ballot.ready()
            answers.append(ballot.result())
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert answers == [False, True, False, True]
