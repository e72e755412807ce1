"""One rank of an FSDP2 job whose mesh spans several "nodes", each node's ranks sharing a
volume of their own (``BASE/node-K``), saving through the shim every 2 steps.

Run by ``test_ckpt_parts.py`` with RANK/LOCAL_RANK/WORLD_SIZE/LOCAL_WORLD_SIZE/MASTER_* set:
``fsdp_nodes_job.py BASE OUT STEPS [--record] [--kill-at STEP] [--expected REF_OUT]``.
Each rank restores what the shim offers (every rank agrees on the step), trains to STEPS with
a global batch of 24 samples split among the ranks, and writes ``OUT/result-<rank>.json``
(the step restored, each step's global loss, the restored state's mismatches against
``REF_OUT/full-<step>.pt``). ``--record``: rank 0 writes the full tensors of every saved step
(``OUT/full-<step>.pt``; STEPS should be one, the end). ``--kill-at``: node 2's first rank
dies once the global commit of that step gave it the table, before it renames its part.
``--warm``: the last step, once durable, is restored from the rank's host buffer into its
live DTensors (``result["warm"]``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from fsdp_job import build, full, mismatches
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

import goodput.checkpoint.engine.persist as persist
from goodput.checkpoint.engine.host_restore import HostRestore, restore_from_host
from goodput.checkpoint.engine.sharded_save import is_dtensor
from goodput.checkpoint.engine.tree import flatten
from goodput.shim import ShimConfig, TrainerShim
from goodput.shim.rescale import BatchPlan

EVERY = 2
GLOBAL_BATCH = 24
KILLED_EXIT = 17


def train_step(model: torch.nn.Module, optim: torch.optim.Optimizer, step: int) -> float:
    """One step on this rank's share of the step's global batch; returns the global loss."""
    rank, world = dist.get_rank(), dist.get_world_size()
    per_rank = GLOBAL_BATCH // world
    x = torch.randn(GLOBAL_BATCH, 12, generator=torch.Generator().manual_seed(1000 + step))
    loss = model(x[rank * per_rank : (rank + 1) * per_rank]).pow(2).mean()
    loss.backward()
    optim.step()
    optim.zero_grad()
    total = loss.detach().clone()
    dist.all_reduce(total)
    return float(total) / world


def die_before_renaming(step: int) -> None:
    """This process exits as soon as its part of ``step`` has the commit table."""
    commit = persist.commit_sharded

    def commit_or_die(*args: Any, part: Any = None, **kwargs: Any) -> None:
        if part is not None and args[1] == step:
            os._exit(KILLED_EXIT)
        commit(*args, part=part, **kwargs)

    persist.commit_sharded = commit_or_die  # type: ignore[assignment]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("base", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("steps", type=int)
    parser.add_argument("--record", action="store_true")
    parser.add_argument("--kill-at", type=int, default=0)
    parser.add_argument("--expected", type=Path)
    parser.add_argument("--warm", action="store_true")
    args = parser.parse_args()
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    per_node = int(os.environ["LOCAL_WORLD_SIZE"])
    node, local_rank = divmod(rank, per_node)
    if args.kill_at and node == 2 and local_rank == 0:
        die_before_renaming(args.kill_at)
    config = ShimConfig(
        job="parts-test",
        rank=rank,
        world_size=world,
        local_rank=local_rank,
        local_world_size=per_node,
        ckpt_dir=str(args.base / f"node-{node}"),
        ckpt_every=EVERY,
        keep_last=3,
    )
    shim = TrainerShim(config, install_signal_handlers=False)
    model, optim = build(0, world)
    model_sd, optim_sd = get_state_dict(model, optim)
    template = {"model": model_sd, "optim": optim_sd, "step": 0}
    restored = shim.restore(template, plan=BatchPlan(global_batch=GLOBAL_BATCH, lr=1e-2))
    result: dict[str, Any] = {"start": 0, "losses": {}, "mismatches": []}
    if restored is not None:
        set_state_dict(
            model,
            optim,
            model_state_dict=restored.state["model"],
            optim_state_dict=restored.state["optim"],
        )
        result["start"] = restored.step
        result["global_batch"] = restored.plan.global_batch if restored.plan else None
        result["local_rows"] = model[0].weight.to_local().shape[0]
        model_sd, optim_sd = get_state_dict(model, optim)
        now = full({"model": model_sd, "optim": optim_sd})
        if args.expected is not None:
            expected = torch.load(args.expected / f"full-{restored.step}.pt", weights_only=True)
            result["mismatches"] = mismatches(expected, now)
    step = result["start"]
    state: dict[str, Any] = restored.state if restored is not None else template
    while step < args.steps:
        result["losses"][step] = train_step(model, optim, step)
        step += 1
        model_sd, optim_sd = get_state_dict(model, optim)
        state = {"model": model_sd, "optim": optim_sd, "step": step}
        if step % EVERY == 0:
            if args.record:  # before the save: no collective may follow a killed commit
                record(full({"model": model_sd, "optim": optim_sd}), args.out / f"full-{step}.pt")
            shim.save(state, step)
    if args.warm:
        result["warm"] = warm_restore(shim, model, optim, step, args.expected)
    shim.finish(state, step)  # saves only a step not saved yet, then waits until durable
    (args.out / f"result-{rank}.json").write_text(json.dumps(result))
    if args.kill_at:  # a rank is gone: no collective can end this run, the files do
        wait_for_results(args.out, [r for r in range(world) if r != 2 * per_node])
        return
    dist.barrier()
    dist.destroy_process_group()


def warm_restore(
    shim: TrainerShim, model: torch.nn.Module, optim: torch.optim.Optimizer, step: int, ref: Path
) -> dict[str, Any]:
    """The last step, durable, restored from this rank's host buffer into the live DTensors
    (as after an in-process restart): what it took from memory and from the volume."""
    shim.engine.wait_until_idle()
    dist.barrier()  # every leader's persist is done too: every part renamed
    held = shim.engine.host_snapshot(step)
    assert held is not None
    model_sd, optim_sd = get_state_dict(model, optim)
    outcome = restore_from_host(shim.engine, step, {"model": model_sd, "optim": optim_sd})
    assert isinstance(outcome, HostRestore), outcome
    weight = outcome.state["model"]["0.weight"]
    expected = torch.load(ref / f"full-{step}.pt", weights_only=True)
    return {
        "host_bytes": outcome.host_bytes,
        "volume_bytes": outcome.volume_bytes,
        "shard_bytes": held[0].slice_bytes,
        "local_shape": list(weight.to_local().shape),
        # the plain tensors (the optimizer's step counts): the part's leader wrote them
        "plain_bytes": sum(t.nbytes for t in flatten(outcome.state).tensors if not is_dtensor(t)),
        "same_object": weight is model_sd["0.weight"],
        "mismatches": mismatches(expected, full(outcome.state)),
    }


def record(tensors: Any, path: Path) -> None:
    if dist.get_rank() == 0:
        torch.save(tensors, path)


def wait_for_results(out: Path, ranks: list[int]) -> None:
    """Rank 0 (whose process serves the store) leaves only after every survivor finished."""
    deadline = time.monotonic() + 120
    while dist.get_rank() == 0 and time.monotonic() < deadline:
        if all((out / f"result-{rank}.json").exists() for rank in ranks):
            return
        time.sleep(0.1)


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
    # as fsdp_job.py: leave without the interpreter's finalization (gloo threads of DTensors)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
