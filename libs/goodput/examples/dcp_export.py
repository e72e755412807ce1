"""Users keep their tools: an FSDP2 job checkpointed by goodput, read back with plain DCP.

Run it (CPU, gloo, two ranks; any number of ranks works)::

    python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        -m goodput.examples.dcp_export /tmp/dcp-example

Each rank trains a small FSDP2 model for a few steps and saves it through goodput's
``CheckpointEngine`` (every rank its own shards, into ``DIR/goodput``). Rank 0 then runs::

    goodput ckpt export DIR/goodput --dcp DIR/dcp

With ``--parts`` every rank stands for a node with a volume of its own
(``DIR/goodput/node<k>``): the engine saves one part per node and commits them together
(``PartLayout``), and the export reads every node's volume::

    goodput ckpt export DIR/goodput/node0 DIR/goodput/node1 --dcp DIR/dcp

and every rank loads ``DIR/dcp`` with ``torch.distributed.checkpoint.load`` into a freshly
built FSDP2 model (another seed), gathers every parameter and optimizer tensor and compares
it bit for bit with what was saved; rank 0 also converts the export with DCP's
``dcp_to_torch_save`` and compares that. It prints ``identical`` or exits non-zero naming
the tensors that differ.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from goodput.checkpoint.engine import CheckpointEngine
from goodput.checkpoint.engine.parts_commit import PartLayout

STEPS = 3


def build(seed: int, world: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Odd sizes, so the ranks' shards differ in rows."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(12, 33), torch.nn.LayerNorm(33), torch.nn.ReLU(), torch.nn.Linear(33, 5)
    )
    mesh = init_device_mesh("cpu", (world,))
    for layer in (model[0], model[3]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train(model: torch.nn.Module, optim: torch.optim.Optimizer) -> None:
    for step in range(STEPS):
        x = torch.randn(8, 12, generator=torch.Generator().manual_seed(step))
        model(x).pow(2).mean().backward()
        optim.step()
        optim.zero_grad()


def gathered(state: Any) -> Any:
    """Every DTensor gathered whole (a collective: every rank calls it)."""
    if isinstance(state, DTensor):
        return state.full_tensor()
    if isinstance(state, dict):
        return {key: gathered(value) for key, value in state.items()}
    if isinstance(state, list):
        return [gathered(value) for value in state]
    return state


def differences(expected: Any, actual: Any, path: str = "") -> list[str]:
    """Where two states differ (tensors compared as bytes, so -0.0 and NaNs count)."""
    if isinstance(expected, torch.Tensor):
        same = (
            isinstance(actual, torch.Tensor)
            and (expected.dtype, expected.shape) == (actual.dtype, actual.shape)
            and torch.equal(
                expected.reshape(-1).view(torch.uint8), actual.reshape(-1).view(torch.uint8)
            )
        )
        return [] if same else [path]
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or set(expected) != set(actual):
            return [f"{path}: keys"]
        return [
            d for key in expected for d in differences(expected[key], actual[key], f"{path}/{key}")
        ]
    if isinstance(expected, list):
        if not isinstance(actual, list) or len(expected) != len(actual):
            return [f"{path}: length"]
        return [
            d
            for i, pair in enumerate(zip(expected, actual, strict=True))
            for d in differences(*pair, f"{path}/{i}")
        ]
    return [] if expected == actual else [f"{path}: {expected!r} != {actual!r}"]


def engine_for(workdir: Path, rank: int, world: int, parts: bool) -> CheckpointEngine:
    """One root shared by every rank, or (``parts``) a volume per rank standing for a node."""
    if not parts:
        return CheckpointEngine(workdir / "goodput")
    layout = PartLayout(
        part=rank, parts=world, rank=rank, world=world, local_rank=0, local_world=1,
        namespace="dcp-example",
    )  # fmt: skip
    return CheckpointEngine(workdir / "goodput" / f"node{rank}", parts=layout)


def main(workdir: Path, parts: bool) -> int:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model, optim = build(seed=0, world=world)
    train(model, optim)
    model_sd, optim_sd = get_state_dict(model, optim)
    saved = {"model": model_sd, "optim": optim_sd, "step": STEPS}
    with engine_for(workdir, rank, world, parts) as engine:
        result = engine.save(saved, STEPS, dp_rank=rank, dp_world=world).wait(300)
    if result.error:
        raise SystemExit(f"rank {rank}: save failed: {result.error}")
    expected = gathered(saved)
    dist.barrier()  # every rank's shards are durable and the step committed
    if rank == 0:
        volumes = [workdir / "goodput" / f"node{k}" for k in range(world)]
        sources = volumes if parts else [workdir / "goodput"]
        command = ["goodput", "ckpt", "export", *map(str, sources), "--dcp", str(workdir / "dcp")]
        print("$", " ".join(command), flush=True)
        subprocess.run([sys.executable, "-m", "goodput.tools.cli.main", *command[1:]], check=True)
    dist.barrier()

    fresh, fresh_optim = build(seed=1, world=world)
    model_sd, optim_sd = get_state_dict(fresh, fresh_optim)  # creates the optimizer's state
    loaded: dict[str, Any] = {"model": model_sd, "optim": optim_sd, "step": 0}
    dcp.load(loaded, checkpoint_id=workdir / "dcp")
    set_state_dict(
        fresh, fresh_optim, model_state_dict=loaded["model"], optim_state_dict=loaded["optim"]
    )
    model_sd, optim_sd = get_state_dict(fresh, fresh_optim)
    problems = differences(
        expected, gathered({"model": model_sd, "optim": optim_sd, "step": loaded["step"]})
    )
    if rank == 0:
        dcp_to_torch_save(workdir / "dcp", workdir / "consolidated.pt")
        consolidated = torch.load(workdir / "consolidated.pt", weights_only=True)
        problems += [f"dcp_to_torch_save{p}" for p in differences(expected, consolidated)]
    print(
        f"rank {rank}: " + ("identical" if not problems else f"DIFFERENT: {problems}"), flush=True
    )
    dist.barrier()
    dist.destroy_process_group()
    return 1 if problems else 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    code = main(Path(sys.argv[1]), parts="--parts" in sys.argv[2:])
    # leave without the interpreter's finalization: FSDP's DTensors still hold the gloo group,
    # and a gloo thread freeing their work during finalization can abort the process
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
