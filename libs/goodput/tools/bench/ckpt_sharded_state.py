"""The state and place of one rank of `goodput bench ckpt --sharded` (and of `goodput bench
gpu`'s sharded restore): an FSDP2 model + AdamW sharded over one mesh of every rank, its
tensors as this rank holds them, and the rank's node, volume and part layout.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from goodput.checkpoint.engine import CheckpointEngine
from goodput.checkpoint.engine.parts_commit import PartLayout
from goodput.checkpoint.format import node_volume
from goodput.shim.collectives import all_reduce_ints, collective_device
from goodput.tools.bench.ckpt_measure import PageCache

JOB = "bench"
#: the restores of each repeat (the report's names for them), in a rotating order: goodput as
#: the shim restores after a hot swap (the survivors' nodes from their shared memory), goodput
#: from the volumes alone, DCP
RESTORES = ("goodput", "goodput_volumes", "dcp")
LAYERS = 4


def node_name(node: int) -> str:
    return f"node{node}"


def rotated(kinds: tuple[str, ...], repeat: int) -> tuple[str, ...]:
    """``kinds`` starting at the repeat's turn, so that each goes first as often as the others."""
    turn = repeat % len(kinds)
    return kinds[turn:] + kinds[:turn]


def build(
    size_bytes: int, world: int, device: str = "cpu"
) -> tuple[torch.nn.Sequential, torch.optim.Optimizer]:
    """``LAYERS`` square linear layers whose weights, biases and AdamW moments (4 bytes each,
    3 copies) make about ``size_bytes``, FSDP2-sharded over one mesh of every rank on
    ``device`` ("cpu", or "cuda": `goodput bench gpu`'s sharded restore onto the GPU)."""
    width = max(16, int(math.sqrt(size_bytes / (12 * LAYERS))) // 16 * 16)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*(torch.nn.Linear(width, width) for _ in range(LAYERS)))
    model.to(device)
    mesh = init_device_mesh(device, (world,))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def forward_backward(model: torch.nn.Sequential, step: int) -> None:
    """One batch's forward and backward (gradients only: the state saved is unchanged)."""
    first = model[0]
    assert isinstance(first, torch.nn.Linear)  # build's layers (fully_shard keeps the class)
    width = first.in_features
    x = torch.randn(8, width, generator=torch.Generator().manual_seed(step))
    x = x.to(first.weight.device)
    model(x).pow(2).mean().backward()


def train_step(model: torch.nn.Sequential, optim: torch.optim.Optimizer, step: int) -> None:
    forward_backward(model, step)
    optim.step()
    optim.zero_grad()


def state_of(model: torch.nn.Module, optim: torch.optim.Optimizer, step: int) -> dict[str, Any]:
    model_sd, optim_sd = get_state_dict(model, optim)
    return {"model": model_sd, "optim": optim_sd, "step": step}


def local_tensors(state: Any) -> list[torch.Tensor]:
    """Every tensor of the state as this rank holds it (DTensors: the local shard), in order."""
    if isinstance(state, DTensor):
        return [state.to_local()]
    if isinstance(state, torch.Tensor):
        return [state]
    if isinstance(state, dict):
        return [t for key in sorted(state, key=str) for t in local_tensors(state[key])]
    if isinstance(state, list | tuple):
        return [t for value in state for t in local_tensors(value)]
    return []


def same_bits(expected: list[torch.Tensor], state: Any) -> bool:
    actual = local_tensors(state)
    return len(actual) == len(expected) and all(
        a.shape == e.shape
        and torch.equal(a.reshape(-1).view(torch.uint8), e.reshape(-1).view(torch.uint8))
        for a, e in zip(actual, expected, strict=True)
    )


def slowest(seconds: float) -> float:
    """The slowest rank's figure (the job waits for it)."""
    value = torch.tensor([seconds], dtype=torch.float64, device=collective_device())
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return float(value.item())


def every(flag: bool) -> bool:
    return bool(all_reduce_ints([int(flag)], dist.ReduceOp.MIN)[0])


class Rank:
    """This rank's place: node, volume, the engine's part layout."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.node, self.local = divmod(self.rank, args.procs_per_node)
        self.volume = node_volume(args.work, node_name(self.node), JOB)
        self.cache = PageCache()  # rank 0 drops the machine's (or the work dir's) page cache
        self.layout = PartLayout(
            part=self.node,
            parts=args.nodes,
            rank=self.rank,
            world=self.world,
            local_rank=self.local,
            local_world=args.procs_per_node,
            namespace=f"{JOB}/{args.run_id}",
        )

    def engine(self) -> CheckpointEngine:
        """An engine as the shim builds it: host buffers in the node's shared memory."""
        return CheckpointEngine(
            self.volume,
            parts=self.layout,
            writer_threads=self.args.writer_threads,
            keep_last=2,
            node_shared=True,
        )

    @property
    def local_world(self) -> int:
        """The ranks of this rank's node."""
        return int(self.args.procs_per_node)

    @property
    def replaced(self) -> bool:
        """On the node that is lost and replaced (the last one)."""
        return self.node == self.args.nodes - 1


def zero(template: Any) -> None:
    with torch.no_grad():
        for tensor in local_tensors(template):
            tensor.zero_()


def state_bytes(state: Any) -> int:
    """The global state's tensor bytes (every shard once)."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(state_bytes(value) for value in state.values())
    if isinstance(state, list | tuple):
        return sum(state_bytes(value) for value in state)
    return 0
