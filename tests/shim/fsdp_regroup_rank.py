"""One rank of an FSDP2 job (gloo, CPU) that switches process groups in process.

Run by ``test_fsdp_regroup.py``, one process per rank: ``fsdp_regroup_rank.py OUT SHAPE
PORT2`` (SHAPE ``2`` for FSDP over two ranks, ``2x2`` for HSDP over four). Two identical
models train on the first group: the *straight* one all STEPS steps, the *restarted* one
SAVED, then a step that fails mid-forward (its first layer left unsharded) and one whose
collective fails: rank 1 aborts the old group (its connections cut), as a dead peer would.
Every rank aborts, and a new group forms on a new TCPStore port, as an in-process restart
does; ``regroup_fsdp`` re-points the restarted model, which trains the
remaining steps on the new group. The result records whether its end state is bit-identical
to the straight one's, whether its parameters and optimizer state are the same objects with
the same bytes across the regroup, which groups its all-gathers use, what using the old
group (or training a third model without the regroup) does, and the one line a model with unknown internals is refused with.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from goodput.shim.fsdp_regroup import FsdpRegroupError, regroup_fsdp
from goodput.shim.group_abort import GroupAbort
from goodput.shim.group_sockets import opened_by

SAVED, STEPS = 3, 5


def build(shape: tuple[int, ...]) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 30), torch.nn.ReLU()
    )
    names = ("replicate", "shard") if len(shape) == 2 else ("shard",)
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train_step(model: torch.nn.Module, optim: torch.optim.Optimizer, step: int) -> None:
    # each rank its own batch, the same for both models
    seed = 1000 * step + dist.get_rank()
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(seed))
    model(x).pow(2).mean().backward()
    # a DTensor collective of its own (the norm's partial sums), on the mesh of the grads' specs
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    optim.step()
    optim.zero_grad(set_to_none=True)


def abandon_step(model: torch.nn.Module, optim: torch.optim.Optimizer, step: int) -> None:
    """A step that fails mid-forward, as one whose peer died would: the first layer was
    all-gathered (unsharded), the root's forward never ended."""

    def fail(*_: Any) -> None:
        raise ConnectionError("a peer died")

    hook = model[2].register_forward_pre_hook(fail)
    try:
        train_step(model, optim, step)
    except ConnectionError:
        pass
    finally:
        hook.remove()


def optimized(optim: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The parameters the optimizer steps (FSDP's sharded ones), in order."""
    return [p for group in optim.param_groups for p in group["params"]]


def local_state(optim: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Every local shard of the parameters and the optimizer state, by position, as plain
    tensors (the module's own parameters are unsharded ones while a forward is abandoned)."""
    state = {}
    for index, param in enumerate(optimized(optim)):
        state[str(index)] = local(param).clone()
        for key, value in optim.state[param].items():
            state[f"{index}/{key}"] = local(value).clone()
    return state


def local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def differing(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    """Names whose tensors differ in any bit (or exist on one side only)."""
    bad = sorted(set(a) ^ set(b))
    for name in set(a) & set(b):
        x, y = a[name], b[name]
        if x.shape != y.shape or not torch.equal(
            x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8)
        ):
            bad.append(name)
    return bad


def objects(optim: torch.optim.Optimizer) -> list[int]:
    """The ids of the parameters and of every optimizer state tensor."""
    return [id(p) for p in optimized(optim)] + [
        id(value) for entry in optim.state.values() for value in entry.values()
    ]


def groups_in_use(model: torch.nn.Module) -> list[dist.ProcessGroup]:
    """The groups the model's all-gathers and reduce-scatters would use."""
    return [
        pg
        for module in model.modules()
        if hasattr(module, "_get_fsdp_state")
        for group in module._get_fsdp_state()._fsdp_param_groups
        for pg in (group._all_gather_process_group, group._reduce_scatter_process_group)
    ]


def registered(group: dist.ProcessGroup) -> bool:
    """Whether ``group`` is one of the current world's (an aborted one was forgotten)."""
    try:
        dist.get_process_group_ranks(group)
    except (KeyError, ValueError, RuntimeError):
        return False
    return True


def refusal(shape: tuple[int, ...]) -> dict[str, Any]:
    """A model whose FSDPParam lacks a field this torch should have: one line, nothing changed."""
    model, _ = build(shape)
    group = model[0]._get_fsdp_state()._fsdp_param_groups[0]
    del group.fsdp_params[0]._sharding_spec
    before = [p._spec for p in model.parameters()]
    try:
        regroup_fsdp(model)
    except FsdpRegroupError as exc:
        message = str(exc)
    else:
        message = ""
    unchanged = all(p._spec is spec for p, spec in zip(model.parameters(), before, strict=True))
    plain = torch.nn.Linear(2, 2)
    try:
        regroup_fsdp(plain)
    except FsdpRegroupError as exc:
        plain_message = str(exc)
    else:
        plain_message = ""
    return {"message": message, "unchanged": unchanged, "plain_message": plain_message}


def main(out: Path, shape: tuple[int, ...], port2: int) -> None:
    _, sockets = opened_by(lambda: dist.init_process_group("gloo", timeout=timedelta(seconds=60)))
    rank, world = dist.get_rank(), dist.get_world_size()
    # an HSDP mesh's subgroups have connections of their own, which the abort must cut too
    built, mesh_sockets = opened_by(lambda: [build(shape) for _ in range(3)])
    (straight, straight_optim), (model, optim), (unregrouped, unregrouped_optim) = built
    # unregrouped: the control, restarted without regroup_fsdp
    train_step(unregrouped, unregrouped_optim, 0)
    for step in range(STEPS):
        train_step(straight, straight_optim, step)
    for step in range(SAVED):
        train_step(model, optim, step)
    abandon_step(model, optim, SAVED)
    expected = local_state(straight_optim)
    old_groups = groups_in_use(model)
    old_world = dist.group.WORLD
    before_ids, before = objects(optim), local_state(optim)

    # the in-process restart's: rank 1 aborts the old group (cuts its connections), which
    # fails the others' next step in a collective, as a dead peer would; they abort too, and
    # a new group forms on a new store (goodput.shim.inprocess)
    dist.barrier()  # every rank done with the steps above before rank 1 cuts
    abort = GroupAbort(sockets=sockets | mesh_sockets)
    if rank != 1:
        try:
            train_step(model, optim, SAVED)
            failed_step_error = ""
        except RuntimeError as exc:
            failed_step_error = str(exc).splitlines()[0]
        optim.zero_grad(set_to_none=True)  # the job's release_group
    assert abort.wait(30) == ""
    abort.release().join(30)
    opened_by(
        lambda: dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port2}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=60),
        )
    )
    try:
        train_step(unregrouped, unregrouped_optim, 1)
        unregrouped_error = ""
    except Exception as exc:  # any failure is what is recorded
        unregrouped_error = f"{type(exc).__name__}: {exc}".splitlines()[0]
    started = time.perf_counter()
    mesh = regroup_fsdp(model, [optim])
    regroup_s = time.perf_counter() - started
    after_regroup = local_state(optim)
    # the module's parameters are the sharded ones the optimizer holds again
    registered_sharded = [id(p) for p in model.parameters()] == [id(p) for p in optimized(optim)]
    new_groups = groups_in_use(model)
    specs_on_new_mesh = all(p._spec.mesh is mesh for p in model.parameters()) and all(
        value._spec.mesh is mesh
        for entry in optim.state.values()
        for value in entry.values()
        if isinstance(value, DTensor)
    )
    # DTensor's sharding cache had these ops' outputs on the old (equal) mesh
    op_outputs_on_new_mesh = all(
        (p.detach() * 2).device_mesh is mesh and p.detach().sum().device_mesh is mesh
        for p in model.parameters()
    )
    try:
        dist.all_reduce(torch.ones(1), group=old_world)
        old_group_error = ""
    except Exception as exc:  # any failure is what is recorded
        old_group_error = f"{type(exc).__name__}: {exc}".splitlines()[0]
    for step in range(SAVED, STEPS):
        train_step(model, optim, step)
    result = {
        "world": world,
        "mesh_shape": list(mesh.shape),
        "regroup_s": regroup_s,
        "moved_before_regroup": bool(differing(expected, before)),
        "end_differs": differing(expected, local_state(optim)),
        "same_objects": objects(optim) == before_ids,
        "registered_sharded": registered_sharded,
        "regroup_changed_bytes": differing(before, after_regroup),
        "old_groups_registered": any(registered(pg) for pg in old_groups),
        "new_groups_registered": all(registered(pg) for pg in new_groups),
        "new_groups_are_old": any(pg is old for pg in new_groups for old in old_groups),
        "specs_on_new_mesh": specs_on_new_mesh,
        "op_outputs_on_new_mesh": op_outputs_on_new_mesh,
        "old_group_error": old_group_error,
        "failed_step_error": failed_step_error if rank != 1 else "rank 1 cut the group",
        "unregrouped_error": unregrouped_error,
        "refusal": refusal(shape),
    }
    (out / f"result-{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    shape = tuple(int(size) for size in sys.argv[2].split("x"))
    main(Path(sys.argv[1]), shape, int(sys.argv[3]))
    # as fsdp_warm_job.py: skip the interpreter's finalization (gloo threads vs FSDP's DTensors)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
