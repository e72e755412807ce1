"""One rank of an FSDP2 job (gloo, CPU) restarting in process: the warm restore keeps its shard.

Run by ``test_warm_sharded.py``, one process per rank, all ranks on one node sharing ROOT:
``fsdp_warm_job.py ROOT OUT``. Each rank trains 3 steps, saves step 3 through the shim, keeps
a copy of its local shards, trains 2 more steps (the live state moves on), then restarts in
process (``answer_rejoin(ok=True)``, as after a Rejoin) and restores through the shim: the
result records the tier, the local shapes, whether the restored tensors are the live ones,
every mismatch with the copy, and the peak memory the restore took (``VmHWM`` reset before
it). Then, as a rank started in another's place would (a fresh engine, no buffer of its own),
it restores from the node's segments; rank 0 flips a byte of rank 1's segment and rank 1
restores again: the result records the engine's accounting of memory and volume bytes.
"""

from __future__ import annotations

import gc
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from fsdp_job import shard, train_step
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

from goodput import schemas
from goodput.checkpoint.engine import CheckpointEngine
from goodput.checkpoint.engine.host_restore import HostRestore, restore_from_host
from goodput.checkpoint.engine.node_segments import HEADER_BYTES, NodeSegments
from goodput.shim import ShimConfig, TrainerShim

SAVED_STEP = 3


def build(world: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A [256, 64] weight (sharded: [128, 64] per rank of two) and a [4096, 2048] one, large
    enough that a consolidated copy would show in the memory the restore takes."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(64, 256),
        torch.nn.ReLU(),
        torch.nn.Linear(256, 2048),
        torch.nn.ReLU(),
        torch.nn.Linear(2048, 4096),
    )
    mesh = init_device_mesh("cpu", (world,))
    return shard(model, mesh, (model[0], model[2], model[4]))


def state_of(model: torch.nn.Module, optim: torch.optim.Optimizer) -> dict[str, Any]:
    model_sd, optim_sd = get_state_dict(model, optim)
    return {"model": model_sd, "optim": optim_sd, "step": SAVED_STEP}


def leaves(state: Any, path: str = "") -> dict[str, torch.Tensor]:
    """Every tensor of the state by path (a DTensor as itself)."""
    if isinstance(state, torch.Tensor):
        return {path: state}
    if isinstance(state, dict):
        return {
            k: v for key, value in state.items() for k, v in leaves(value, f"{path}/{key}").items()
        }
    if isinstance(state, list):
        return {
            k: v for i, value in enumerate(state) for k, v in leaves(value, f"{path}/{i}").items()
        }
    return {}


def local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def mismatches(expected: dict[str, torch.Tensor], state: Any) -> list[str]:
    actual = {key: local(value) for key, value in leaves(state).items()}
    bad = [key for key in expected if key not in actual]
    for key, want in expected.items():
        have = actual.get(key)
        if have is not None and not (
            have.shape == want.shape
            and have.dtype == want.dtype
            and torch.equal(have.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8))
        ):
            bad.append(key)
    return bad


def memory_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def accounting(outcome: HostRestore | str, expected: dict[str, torch.Tensor]) -> dict[str, Any]:
    if isinstance(outcome, str):
        return {"error": outcome}
    return {
        "host_bytes": outcome.host_bytes,
        "volume_bytes": outcome.volume_bytes,
        "mismatches": mismatches(expected, outcome.state),
    }


def main(root: Path, out: Path) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    model, optim = build(world)
    config = ShimConfig(
        job="warm-shard",
        node="node-0",
        rank=rank,
        world_size=world,
        local_rank=rank,
        local_world_size=world,
        ckpt_dir=str(root),
    )
    shim = TrainerShim(config, install_signal_handlers=False)
    assert shim.restore(state_of(model, optim)) is None
    for step in range(SAVED_STEP):
        train_step(model, optim, step, features=64)
    shim.save(state_of(model, optim), SAVED_STEP)
    shim.engine.wait_until_idle()
    dist.barrier()  # every rank's part durable: rank 0 committed step 3
    expected = {key: local(value).clone() for key, value in leaves(state_of(model, optim)).items()}
    shard_bytes = sum(t.numel() * t.element_size() for t in expected.values())
    for step in range(SAVED_STEP, SAVED_STEP + 2):
        train_step(model, optim, step, features=64)
    moved = bool(mismatches(expected, state_of(model, optim)))

    # the in-process restart: the process, its model and its host buffer stay
    rejoin = schemas.Rejoin(
        job="warm-shard", attempt=2, master_addr="127.0.0.1", master_port=1, world_size=world
    )
    shim.answer_rejoin(rejoin, ok=True)
    template = state_of(model, optim)
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    before_kb = memory_kb("VmRSS")
    restored = shim.restore(template)
    peak_kb = memory_kb("VmHWM")
    assert restored is not None
    weight = restored.state["model"]["0.weight"]
    live = leaves(template)
    same_objects = all(leaves(restored.state).get(key) is value for key, value in live.items())
    set_state_dict(
        model,
        optim,
        model_state_dict=restored.state["model"],
        optim_state_dict=restored.state["optim"],
    )
    result: dict[str, Any] = {
        "tier": restored.tier,
        "step": restored.step,
        "moved_before_restore": moved,
        "restored_local_shape": list(local(weight).shape),
        "model_local_shape": list(model[0].weight.to_local().shape),
        "global_shape": list(weight.shape),
        "restored_is_dtensor": isinstance(weight, DTensor),
        "same_objects": same_objects,
        "mismatches": mismatches(expected, restored.state),
        "after_set_state_dict": mismatches(expected, state_of(model, optim)),
        "shard_bytes": shard_bytes,
        "restore_peak_bytes": (peak_kb - before_kb) * 1024,
        "own": accounting(restore_from_host(shim.engine, SAVED_STEP, template), expected),
    }

    # a rank started in this one's place: no buffer of its own, the node's segments instead
    with CheckpointEngine(root, node_shared=True) as replacement:
        dist.barrier()
        fresh = state_of(*build_again(model, optim))
        result["replacement"] = accounting(
            restore_from_host(replacement, SAVED_STEP, fresh, own=False), expected
        )
        dist.barrier()
        if rank == 0:  # a flipped byte in rank 1's segment, early in its first shard
            with NodeSegments(root).peers(SAVED_STEP, sharded=True) as peers:
                victim = next(p.name for p in peers if p.header.dp_rank == 1)
            with open(Path("/dev/shm") / victim, "r+b") as segment:
                segment.seek(HEADER_BYTES + 10)
                byte = segment.read(1)[0]
                segment.seek(HEADER_BYTES + 10)
                segment.write(bytes([byte ^ 0xFF]))
        dist.barrier()
        if rank == 1:
            result["corrupt_segment"] = accounting(
                restore_from_host(replacement, SAVED_STEP, state_of(model, optim), own=False),
                expected,
            )
        dist.barrier()
    (out / f"result-{rank}.json").write_text(json.dumps(result))
    shim.finish(restored.state, SAVED_STEP)
    dist.barrier()
    dist.destroy_process_group()


def build_again(
    model: torch.nn.Module, optim: torch.optim.Optimizer
) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The live model with its tensors zeroed: what a replacement restores into."""
    with torch.no_grad():
        for tensor in leaves(state_of(model, optim)).values():
            if tensor.is_floating_point():
                local(tensor).zero_()
    return model, optim


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(Path(sys.argv[1]), Path(sys.argv[2]))
    # as fsdp_job.py: skip the interpreter's finalization (gloo threads vs FSDP's DTensors)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
