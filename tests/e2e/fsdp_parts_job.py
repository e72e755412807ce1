"""A supervised FSDP2 job whose mesh spans every node: its checkpoints are one part per node.

Run by ``test_sharded_parts_job.py`` under ``goodput up`` (one process per rank, gloo on CPU):
``fsdp_parts_job.py STEPS OUT``. It restores through the shim (its volume: the node's own),
trains to STEPS with the same batch on every rank (the global batch does not depend on the
node count), saves when the shim says, paces each step (``PACE_S``) so the test can act
between checkpoints. Rank 0 writes the digest of the full state (every shard gathered) it
saved (``OUT/saved-<step>.json``), restored (``OUT/restored.json``, the last restore) and
ended with (``OUT/final.json``).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from goodput.shim import ShimConfig, TrainerShim

PACE_S = float(os.environ.get("PARTS_JOB_PACE_S", "0.3"))


def build(world: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(12, 33), torch.nn.LayerNorm(33), torch.nn.ReLU(), torch.nn.Linear(33, 5)
    )
    mesh = init_device_mesh("cpu", (world,))  # one FSDP dimension over every node's ranks
    for layer in (model[0], model[3]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train_step(model: torch.nn.Module, optim: torch.optim.Optimizer, step: int) -> float:
    generator = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(8, 12, generator=generator)
    loss = model(x).pow(2).mean()
    loss.backward()
    optim.step()
    optim.zero_grad()
    return float(loss.detach())


def digest(state: dict) -> str:
    """sha256 over every tensor gathered whole, in key order (a collective)."""
    hasher = hashlib.sha256()

    def walk(value, path: str) -> None:
        if isinstance(value, DTensor):
            value = value.full_tensor()
        if isinstance(value, torch.Tensor):
            hasher.update(path.encode())
            hasher.update(value.detach().contiguous().reshape(-1).view(torch.uint8).numpy())
        elif isinstance(value, dict):
            for key in sorted(value, key=str):
                walk(value[key], f"{path}/{key}")
        elif isinstance(value, list):
            for i, item in enumerate(value):
                walk(item, f"{path}/{i}")

    walk(state, "")
    return hasher.hexdigest()


def main(steps: int, out: Path) -> int:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    model, optim = build(world)
    shim = TrainerShim(ShimConfig.from_env())
    model_sd, optim_sd = get_state_dict(model, optim)
    restored = shim.restore({"model": model_sd, "optim": optim_sd, "step": 0})
    done = 0
    if restored is not None:
        set_state_dict(
            model,
            optim,
            model_state_dict=restored.state["model"],
            optim_state_dict=restored.state["optim"],
        )
        done = restored.step
        model_sd, optim_sd = get_state_dict(model, optim)
        restored_digest = digest({"model": model_sd, "optim": optim_sd})
        if dist.get_rank() == 0:
            record = {"step": done, "digest": restored_digest, "world": world}
            (out / "restored.json").write_text(json.dumps(record))
    step = done
    for step in range(done + 1, steps + 1):
        started = time.perf_counter()
        loss = train_step(model, optim, step)
        shim.step_done(step, time.perf_counter() - started, 8, loss)
        if shim.should_checkpoint(step) or shim.should_stop():
            model_sd, optim_sd = get_state_dict(model, optim)
            shim.save({"model": model_sd, "optim": optim_sd, "step": step}, step)
            saved = digest({"model": model_sd, "optim": optim_sd})
            if dist.get_rank() == 0:
                (out / f"saved-{step}.json").write_text(json.dumps({"digest": saved}))
        if shim.should_stop():
            break
        time.sleep(PACE_S)
    model_sd, optim_sd = get_state_dict(model, optim)
    state = {"model": model_sd, "optim": optim_sd, "step": step}
    if step == steps:
        final = digest({"model": model_sd, "optim": optim_sd})
        if dist.get_rank() == 0:
            (out / "final.json").write_text(json.dumps({"digest": final, "resumed_at": done}))
    shim.finish(state, step)
    dist.barrier()
    dist.destroy_process_group()
    return shim.exit_code


if __name__ == "__main__":
    code = main(int(sys.argv[1]), Path(sys.argv[2]))
    sys.stdout.flush()
    sys.stderr.flush()
    # as in tests/ckpt/fsdp_job.py: the FSDP model's DTensors still hold the gloo group, and a
    # gloo thread freeing their work during the interpreter's finalization can abort the rank
    os._exit(code)
