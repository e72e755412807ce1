"""Re-pointing an FSDP2 model at a new process group, for an in-process restart.

After an in-process restart the old group is aborted and a fresh default group of the same
world size is formed (:mod:`goodput.shim.inprocess`). A model sharded with FSDP2
(``fully_shard`` over a ``DeviceMesh``) still names the old group everywhere: in its mesh
(which caches the group objects), in every FSDP state's param groups (``mesh_info``,
``post_forward_mesh_info``), in every ``FSDPParam`` (its mesh infos, shard mesh, SPMD mesh and
``_sharding_spec``) and in each sharded parameter's DTensor spec, so its next all-gather runs
on a dead group. Re-creating the model costs the initialisation the warm path exists to avoid,
and the optimizer refers to the parameter objects. :func:`regroup_fsdp` builds one mesh of the
same shape on the new default group and re-points all of those to it, keeping every
``nn.Parameter`` (and the optimizer's state tensors) as the same objects with the same bytes.

torch has no public call for this (checked in torch 2.13): the mesh infos, param groups and
``FSDPParam`` are private (the new mesh, its coordinate check and the reset of an abandoned
step use public calls: ``init_device_mesh``, ``get_coordinate``, ``reset_iter_state``). Every
private name used is checked first (:func:`_check_torch`, :func:`_check_group`); a torch whose
FSDP2 differs fails with one line naming what is missing, before anything was changed, never
a half re-pointed model. What it does not know how
to re-point it refuses, also in one line: tensor parallelism or an SPMD mesh (parameters that
were DTensors before ``fully_shard``), a mesh that is a slice of a larger one, a custom or
process-group-allocating all-gather/reduce-scatter, a separate reduce-scatter group, and
``reshard_after_forward=<int>`` (its own smaller mesh). HSDP (a 2-D replicate x shard mesh)
is re-pointed like FSDP: the new mesh has the same shape and dimension names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor import debug as _tensor_debug

try:  # private: FSDP2's internals (see the module docstring)
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as _collectives
    from torch.distributed.fsdp._fully_shard import _fsdp_common as _common
    from torch.distributed.fsdp._fully_shard._fully_shard import FSDPModule
except ImportError as exc:  # pragma: no cover - depends on the installed torch
    _IMPORT_ERROR: str = str(exc)
else:
    _IMPORT_ERROR = ""

#: the torch whose FSDP2 internals this module was written against and tested with
KNOWN_TORCH = "2.13"

_STATE_FIELDS = ("_fsdp_param_groups",)
_GROUP_FIELDS = (
    "mesh_info",
    "post_forward_mesh_info",
    "fsdp_params",
    "_all_gather_comm",
    "_reduce_scatter_comm",
)
_PARAM_FIELDS = (
    "mesh_info",
    "post_forward_mesh_info",
    "_shard_mesh",
    "_spmd_mesh",
    "_sharding_spec",
    "_unsharded_dtensor_spec",
    "sharded_param",
    "is_dtensor",
    "_init_shard_mesh",
    "unsharded_accumulated_grad",
)


class FsdpRegroupError(RuntimeError):
    """The model cannot be re-pointed (the one-line reason is the message); nothing changed."""


def regroup_fsdp(model: nn.Module, optimizers: Iterable[torch.optim.Optimizer] = ()) -> DeviceMesh:
    """Re-point every FSDP2 module of ``model`` at a new mesh over the current default group.

    Call it on every rank, after the new default group is initialised (``regroup`` of a
    :class:`~goodput.shim.inprocess.ResumableJob`) and before the state is restored. The new
    mesh has the old one's shape, dimension names and device type (another shape would change
    every shard's size: that is a reshard, not a regroup), and this rank must hold the same
    coordinate in it (the same shard). The parameters stay the same objects, holding the same
    bytes; DTensors in the state of ``optimizers`` (AdamW's moments) are re-pointed too, so
    nothing left references the old group and it can be freed. What an abandoned step left
    behind (unsharded parameters, half-reduced gradients, a forward's trackers) is dropped
    first with FSDP's own ``reset_iter_state``, and the gradients it left on unsharded
    parameters with it. Returns the new mesh. Raises
    :class:`FsdpRegroupError` with one line when it cannot; nothing is re-pointed then.
    """
    _check_torch()
    if not dist.is_initialized():
        raise FsdpRegroupError("regroup_fsdp: no default process group: initialise it first")
    modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not modules:
        raise FsdpRegroupError("regroup_fsdp: the model has no fully_shard module")
    states = [_checked_state(module) for module in modules]
    groups = [group for state in states for group in state._fsdp_param_groups]
    for group in groups:
        _check_group(group)
    meshes = _old_meshes(groups)
    optimizers = list(optimizers)
    new_meshes = {id(old): _new_mesh(old) for old in meshes}
    for root in _outermost(model):
        root.reset_iter_state()  # public: what an abandoned forward or backward left, dropped
    for group in groups:
        _drop_unreduced_grads(group)
    infos: dict[int, Any] = {}

    def moved(info: Any) -> Any:
        """One new mesh info per old one: the objects FSDP shares stay shared."""
        if info is None:
            return None
        if id(info) not in infos:
            infos[id(info)] = dataclasses.replace(info, mesh=new_meshes[id(info.mesh)])
        return infos[id(info)]

    specs: dict[int, Any] = {}
    for group in groups:
        group.mesh_info = moved(group.mesh_info)
        group.post_forward_mesh_info = moved(group.post_forward_mesh_info)
        for fsdp_param in group.fsdp_params:
            _repoint_param(fsdp_param, moved, new_meshes, specs)
    for optimizer in optimizers:
        for tensor in _tensors(optimizer.state.values()):
            _repoint_dtensor(tensor, new_meshes, specs)
    _forget_sharding_cache()
    return new_meshes[id(meshes[0])]


def _check_torch() -> None:
    if _IMPORT_ERROR:
        raise FsdpRegroupError(_unknown(f"cannot import FSDP2's internals ({_IMPORT_ERROR})"))
    for owner, names in (
        (_common, ("FSDPMeshInfo",)),
        (_collectives, ("DefaultAllGather", "DefaultReduceScatter")),
        (_tensor_debug, ("_clear_sharding_prop_cache",)),
        (FSDPModule, ("reset_iter_state", "_get_fsdp_state")),
    ):
        missing = [name for name in names if not hasattr(owner, name)]
        if missing:
            raise FsdpRegroupError(_unknown(f"{owner.__name__} has no {', '.join(missing)}"))


def _unknown(what: str) -> str:
    return (
        f"regroup_fsdp does not know torch {torch.__version__}'s FSDP2 internals: {what} "
        f"(written for torch {KNOWN_TORCH}); the model was left unchanged"
    )


def _require(owner: Any, names: Iterable[str], kind: str) -> None:
    missing = [name for name in names if not hasattr(owner, name)]
    if missing:
        raise FsdpRegroupError(_unknown(f"a {kind} has no {', '.join(missing)}"))


def _checked_state(module: Any) -> Any:
    """The module's FSDP state, with the fields this module re-points."""
    try:
        state = module._get_fsdp_state()
    except AssertionError as exc:  # torch's own way to say "no state on this module"
        raise FsdpRegroupError(
            _unknown(f"a fully_shard module has no FSDP state ({exc})")
        ) from None
    _require(state, _STATE_FIELDS, "FSDP state")
    return state


def _check_group(group: Any) -> None:
    """Fail, in one line, on what this module does not re-point (before anything changed)."""
    _require(group, _GROUP_FIELDS, "FSDP param group")
    info = group.mesh_info
    if not isinstance(info, _common.FSDPMeshInfo):
        raise FsdpRegroupError(
            f"regroup_fsdp: a param group's mesh info is a {type(info).__name__}, not FSDP's "
            "(replicate-only meshes are not supported)"
        )
    _require(info, ("mesh", "shard_mesh_dim", "reduce_scatter_process_group"), "mesh info")
    if getattr(info, "is_spmd_mesh", False):
        raise FsdpRegroupError("regroup_fsdp: an SPMD mesh (dp_mesh_dims) is not supported")
    if info.reduce_scatter_process_group is not None:
        raise FsdpRegroupError("regroup_fsdp: a separate reduce-scatter group is not supported")
    post = group.post_forward_mesh_info
    if post is not None and post is not info:
        raise FsdpRegroupError(
            "regroup_fsdp: reshard_after_forward=<int> (its own smaller mesh) is not supported"
        )
    if not isinstance(group._all_gather_comm, _collectives.DefaultAllGather) or not isinstance(
        group._reduce_scatter_comm, _collectives.DefaultReduceScatter
    ):
        raise FsdpRegroupError(
            "regroup_fsdp: a custom or process-group-allocating all-gather/reduce-scatter "
            "holds the old group and is not supported"
        )
    mesh = info.mesh
    if mesh.size() != dist.get_world_size():
        raise FsdpRegroupError(
            f"regroup_fsdp: the FSDP mesh spans {mesh.size()} ranks, the new group "
            f"{dist.get_world_size()} (a regroup keeps the world size; a slice of a larger "
            "mesh, as with tensor parallelism, is not supported)"
        )
    for fsdp_param in group.fsdp_params:
        _require(fsdp_param, _PARAM_FIELDS, "FSDPParam")
        if fsdp_param.is_dtensor or fsdp_param._unsharded_dtensor_spec is not None:
            raise FsdpRegroupError(
                "regroup_fsdp: parameters that were DTensors before fully_shard (tensor "
                "parallelism) are not supported"
            )
        if not isinstance(fsdp_param.sharded_param, DTensor):
            raise FsdpRegroupError(_unknown("an FSDPParam's sharded_param is not a DTensor"))
        if fsdp_param.mesh_info is not info or fsdp_param._spmd_mesh is not mesh:
            raise FsdpRegroupError(
                "regroup_fsdp: a parameter on a mesh of its own (shard_placement_fn) is not "
                "supported"
            )


def _old_meshes(groups: list[Any]) -> list[DeviceMesh]:
    meshes: dict[int, DeviceMesh] = {}
    for group in groups:
        meshes.setdefault(id(group.mesh_info.mesh), group.mesh_info.mesh)
    return list(meshes.values())


def _outermost(model: nn.Module) -> list[Any]:
    """The FSDP modules no other FSDP module contains: the roots ``reset_iter_state`` takes."""
    named = [(name, m) for name, m in model.named_modules() if isinstance(m, FSDPModule)]
    names = [name for name, _ in named]
    return [
        module
        for name, module in named
        if not any(
            other != name and (other == "" or name.startswith(other + ".")) for other in names
        )
    ]


def _drop_unreduced_grads(group: Any) -> None:
    """The gradients an abandoned backward left on unsharded parameters it never reduced
    (autograd wrote them, the post-backward that takes them did not run). torch 2.13's
    ``reset_iter_state`` keeps them, and the next backward adds to them: an HSDP step that
    failed in its all-reduce ended the next steps off by those gradients (seen in
    ``tests/shim/test_fsdp_regroup.py``)."""
    for fsdp_param in group.fsdp_params:
        unsharded = getattr(fsdp_param, "_unsharded_param", None)  # made at the first unshard
        if unsharded is not None:
            unsharded.grad = None
        fsdp_param.unsharded_accumulated_grad = None


def _new_mesh(old: DeviceMesh) -> DeviceMesh:
    """The old mesh's shape, names and device type over the current default group."""
    shape = tuple(old.shape)
    new = init_device_mesh(old.device_type, shape, mesh_dim_names=old.mesh_dim_names)
    if new.get_coordinate() != old.get_coordinate():
        raise FsdpRegroupError(
            f"regroup_fsdp: this rank's mesh coordinate moved from {old.get_coordinate()} to "
            f"{new.get_coordinate()}: it holds another rank's shards"
        )
    return new


def _repoint_param(
    fsdp_param: Any, moved: Any, new_meshes: dict[int, DeviceMesh], specs: dict[int, Any]
) -> None:
    fsdp_param.mesh_info = moved(fsdp_param.mesh_info)
    fsdp_param.post_forward_mesh_info = moved(fsdp_param.post_forward_mesh_info)
    fsdp_param._shard_mesh = fsdp_param._init_shard_mesh()
    fsdp_param._spmd_mesh = fsdp_param.mesh_info.mesh
    param = fsdp_param.sharded_param
    _repoint_dtensor(param, new_meshes, specs)
    fsdp_param._sharding_spec = param._spec  # one object, as FSDP's reset_sharded_param keeps
    if isinstance(param.grad, DTensor):
        _repoint_dtensor(param.grad, new_meshes, specs)


def _repoint_dtensor(
    tensor: DTensor, new_meshes: dict[int, DeviceMesh], specs: dict[int, Any]
) -> None:
    """Give ``tensor`` a spec on the new mesh (its bytes, placements and metadata unchanged).

    Matched by equality, not identity: DTensor's sharding cache hands an op's output a spec
    seen before with an *equal* mesh (same ranks, shape and names), so an optimizer's moments
    may sit on another object of the old mesh than the parameters do."""
    spec = tensor._spec
    new = new_meshes.get(id(spec.mesh)) or next(
        (mesh for mesh in new_meshes.values() if mesh == spec.mesh), None
    )
    if new is None or spec.mesh is new:
        return  # not on a mesh this regroup replaces, or already re-pointed
    if id(spec) not in specs:
        specs[id(spec)] = dataclasses.replace(spec, mesh=new)
    tensor._spec = specs[id(spec)]


def _tensors(states: Iterable[Any]) -> Iterable[DTensor]:
    for state in states:
        values = state.values() if isinstance(state, dict) else ()
        for value in values:
            if isinstance(value, DTensor):
                yield value


def _forget_sharding_cache() -> None:
    """DTensor caches each op's output spec by its inputs' specs (in Python and in C++), and a
    spec on the new mesh equals one on the old: an op on a re-pointed parameter would get its
    output on the old mesh again (seen in torch 2.13), and a collective on that output would
    use the old group. torch's debug module names this "the recommended way to clear all
    sharding propagation caches"; private, so checked."""
    _tensor_debug._clear_sharding_prop_cache()
