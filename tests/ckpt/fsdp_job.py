"""One rank of a small FSDP2 job on CPU (gloo), saving or restoring through the engine.

Run as a script by ``test_ckpt_sharded.py`` with RANK/WORLD_SIZE/MASTER_* set, one process per
rank: ``fsdp_job.py save|restore ROOT OUT engine|shim``. ``save`` trains 3 steps, saves step 3
and (rank 0) writes the full tensors it saved to ``OUT/expected.pt``; ``save-own-roots`` saves each rank into a root of its own (``save_in_own_roots``); ``restore`` builds the
model from another seed, restores, compares every parameter and optimizer tensor (gathered
whole) with the expected ones bit for bit, trains 2 more steps and writes
``OUT/result-<rank>.json``. How a model is sharded (``shard``) and the seeded step
(``train_step``) are shared: fsdp_warm_job.py imports both and fsdp_nodes_job.py this model
(``build``), so the FSDP2 jobs of this folder shard and step alike.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from goodput.checkpoint.engine import CheckpointEngine
from goodput.checkpoint.engine.events import CheckpointRestored
from goodput.shim import ShimConfig, TrainerShim

SAVED_STEP = 3


def build(
    seed: int, world: int, *, hsdp: bool = False
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Odd sizes, so 2 and 3 ranks shard rows unevenly. ``hsdp``: every rank a replica (mesh
    ``replicate`` x ``shard`` = world x 1), as HSDP with one node per replica."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(12, 33), torch.nn.LayerNorm(33), torch.nn.ReLU(), torch.nn.Linear(33, 5)
    )
    if hsdp:
        mesh = init_device_mesh("cpu", (world, 1), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh("cpu", (world,))
    return shard(model, mesh, (model[0], model[3]))


def shard(
    model: torch.nn.Module, mesh: DeviceMesh, layers: Iterable[torch.nn.Module]
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """``model`` with each of ``layers`` sharded on ``mesh``, then the root (FSDP2 groups each
    layer's parameters apart from the rest), and its AdamW optimizer."""
    for layer in layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train_step(
    model: torch.nn.Module, optim: torch.optim.Optimizer, step: int, *, features: int = 12
) -> float:
    """One step on a batch of 8 drawn from ``step`` alone (every rank the same batch, every
    run the same), minimising the output's mean square; the loss."""
    generator = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(8, features, generator=generator)
    loss = model(x).pow(2).mean()
    loss.backward()
    optim.step()
    optim.zero_grad()
    return float(loss.detach())


def full(state: Any) -> Any:
    """Every DTensor gathered whole (a collective: every rank calls it)."""
    if isinstance(state, DTensor):
        return state.full_tensor()
    if isinstance(state, dict):
        return {key: full(value) for key, value in state.items()}
    if isinstance(state, list):
        return [full(value) for value in state]
    return state


def mismatches(expected: Any, actual: Any, path: str = "") -> list[str]:
    if isinstance(expected, torch.Tensor):
        same = (
            isinstance(actual, torch.Tensor)
            and expected.dtype == actual.dtype
            and expected.shape == actual.shape
            and torch.equal(
                expected.reshape(-1).view(torch.uint8), actual.reshape(-1).view(torch.uint8)
            )
        )
        return [] if same else [path]
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or set(expected) != set(actual):
            return [f"{path}: keys"]
        return [
            m for key in expected for m in mismatches(expected[key], actual[key], f"{path}/{key}")
        ]
    if isinstance(expected, list):
        if not isinstance(actual, list) or len(expected) != len(actual):
            return [f"{path}: length"]
        return [
            m
            for i, pair in enumerate(zip(expected, actual, strict=True))
            for m in mismatches(*pair, f"{path}/{i}")
        ]
    return [] if expected == actual else [f"{path}: {expected!r} != {actual!r}"]


def save_in_own_roots(root: Path, out: Path, rank: int, world: int) -> None:
    """Each rank saves into a root of its own, as with a volume per node: an FSDP2 rank holds
    part of the state (its save must fail), an HSDP replica all of it (its save succeeds)."""
    errors = {}
    for layout in ("fsdp", "hsdp"):
        model, optim = build(0, world, hsdp=layout == "hsdp")
        for step in range(SAVED_STEP):
            train_step(model, optim, step)
        model_sd, optim_sd = get_state_dict(model, optim)
        state = {"model": model_sd, "optim": optim_sd, "step": SAVED_STEP}
        with CheckpointEngine(root / f"{layout}-rank{rank}") as alone:
            errors[layout] = alone.save(state, SAVED_STEP).wait(120).error
    expected = full({"model": model_sd, "optim": optim_sd})  # the HSDP state
    if rank == 0:
        torch.save(expected, out / "expected.pt")
    (out / f"result-{rank}.json").write_text(json.dumps(errors))


def main(phase: str, root: Path, out: Path, via: str) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if phase == "save-own-roots":
        save_in_own_roots(root, out, rank, world)
        dist.barrier()
        dist.destroy_process_group()
        return
    model, optim = build(0 if phase == "save" else 1, world)
    shim = engine = None
    events: list[object] = []  # the engine's events (its restore's bytes read)
    if via == "shim":
        config = ShimConfig(
            rank=rank, world_size=world, local_rank=rank, local_world_size=world, ckpt_dir=str(root)
        )
        shim = TrainerShim(config, install_signal_handlers=False)
    else:
        engine = CheckpointEngine(root, listener=events.append)
    if phase == "save":
        for step in range(SAVED_STEP):
            train_step(model, optim, step)
        model_sd, optim_sd = get_state_dict(model, optim)
        state = {"model": model_sd, "optim": optim_sd, "step": SAVED_STEP}
        if shim is not None:
            shim.save(state, SAVED_STEP)
            shim.finish(state, SAVED_STEP)
        else:
            engine.save(state, SAVED_STEP, dp_rank=rank, dp_world=world)
            engine.close()
        expected = full({"model": model_sd, "optim": optim_sd})
        if rank == 0:
            torch.save(expected, out / "expected.pt")
    else:
        model_sd, optim_sd = get_state_dict(model, optim)  # creates the optimizer's state
        template = {"model": model_sd, "optim": optim_sd, "step": 0}
        if shim is not None:
            restored = shim.restore(template)
            assert restored is not None
            step, state = restored.step, restored.state
        else:
            step, state = engine.restore(into=template)
            engine.close()
        set_state_dict(
            model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
        model_sd, optim_sd = get_state_dict(model, optim)
        expected = torch.load(out / "expected.pt", weights_only=True)
        bad = mismatches(expected, full({"model": model_sd, "optim": optim_sd}))
        before = model_sd["0.weight"].full_tensor().clone()
        losses = [train_step(model, optim, step + i) for i in range(2)]
        moved = not torch.equal(before, model.state_dict()["0.weight"].full_tensor())
        local = model[0].weight.to_local().shape[0]
        result = {
            "step": step,
            "saved_step": state["step"],
            "mismatches": bad,
            "losses": losses,
            "moved": moved,
            "local_rows": local,
            "restored_bytes": [e.bytes for e in events if isinstance(e, CheckpointRestored)],
        }
        (out / f"result-{rank}.json").write_text(json.dumps(result))
        if shim is not None:
            shim.finish(state, step)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4])
    # a rank that passed leaves without the interpreter's finalization: its FSDP model's
    # DTensors still hold the gloo group after destroy_process_group, and a gloo thread freeing
    # their work during finalization can abort the rank (as in test_ckpt_dcp.py)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
