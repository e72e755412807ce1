"""The shim's collectives on a real GPU: NCCL with one rank, gloo with CUDA tensors across two
rank processes sharing the one GPU (NCCL refuses two ranks on one device).

Each rank process is tests/shim/collectives_rank.py, the same program the CPU tests run on
the fake NCCL-like group (tests/shim/test_collectives.py, which also runs in the kit)."""

from __future__ import annotations

import pytest
import torch

from goodput.launch.rank_env import RankEnv
from goodput.shim.standby import bind_rank_device
from tests.gpu.kit import GPU
from tests.shim.collectives_rank import AGREED, run_ranks

pytestmark = GPU


def test_nccl_group_gets_cuda_tensors_and_answers_every_collective() -> None:
    [outcome] = run_ranks("nccl", 1)
    assert outcome["served"] == ["cuda"]
    assert outcome["device"] == {"value": "cuda:0"}
    # one rank: the vote and the agreement return their input without a collective; the
    # reduction, the barrier (with device_ids) and the object broadcast run on NCCL
    assert outcome["any_rank"] == {"value": [True, False]}
    assert outcome["agree_range"] == {"value": [10, 10]}
    assert outcome["max"] == {"value": [0, 7]}
    assert outcome["barrier"] == {"value": None}
    assert outcome["broadcast"] == {"value": "from 0"}


def test_gloo_serving_cuda_only_agrees_across_two_ranks_on_one_gpu() -> None:
    """ "cuda:gloo": a real gloo group that serves CUDA tensors only, as NCCL does."""
    for rank, outcome in enumerate(run_ranks("cuda:gloo", 2)):
        assert outcome["served"] == ["cuda"]
        assert outcome["device"] == {"value": "cuda:0"}
        for call, agreed in AGREED.items():
            assert outcome[call] == {"value": agreed}, (rank, call)


def test_a_rank_is_bound_to_its_own_gpu() -> None:
    """Eight ranks on a node each take their GPU (a process that sees one GPU, a pod holding
    its own, takes that one), so the model, the NCCL communicator and the shim's collectives
    of a rank do not all land on device 0; a rank whose GPU would be another's is refused."""
    count = torch.cuda.device_count()
    for local_rank in range(min(count, 8)):
        env = RankEnv(local_rank=local_rank, local_world_size=count)
        assert bind_rank_device(env) == torch.device("cuda", local_rank)
        assert torch.cuda.current_device() == local_rank
    # the local backend assigns the device: two local nodes on one machine
    assigned = RankEnv(local_rank=0, local_world_size=1, device=count - 1)
    assert bind_rank_device(assigned) == torch.device("cuda", count - 1)
    with pytest.raises(SystemExit, match="ranks would share a GPU"):
        bind_rank_device(RankEnv(local_rank=0, local_world_size=1, device=count))
    torch.cuda.set_device(0)
