"""Rescale callbacks: what a job changes when it resumes at a different data-parallel size.

When goodput scales a job down (a node lost, no spare) or back up, the ranks restart from the
newest checkpoint with a different data-parallel size. Something has to give: the global
batch (then the learning rate should follow it) or the per-rank work (more or fewer
gradient-accumulation steps). The shim runs the callbacks registered with
``TrainerShim.on_rescale`` in order at restore; each sees the old and new layout, the batch
plan and the restored state (which it may edit before the script loads it) and returns the
plan in force from then on. The built-in rules:

- :func:`keep_global_batch`: same global batch and LR; each rank accumulates more (or fewer)
  micro-batches. The math of a step is unchanged.
- :func:`scale_lr` (``"linear"`` or ``"sqrt"``): keep the per-rank batch, so the global batch
  follows the data-parallel size, and scale the LR by the ratio (Goyal et al., 2017) or its
  square root (for adaptive optimizers, Krizhevsky 2014 / Malladi et al. 2022). The saved
  optimizer and LR-scheduler state dicts are scaled too.
- :func:`adjust_schedule`: move the LR scheduler's position so it counts samples, not steps:
  with a smaller global batch a step is less progress through the schedule.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from goodput import schemas
from goodput.shim.dp_layout import DpLayout

if TYPE_CHECKING:
    from goodput.shim.config import ShimConfig


class RescaleError(ValueError):
    """A rescale rule cannot be applied (the batch does not divide, the state lacks a key)."""


class BatchPlan(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How a step's samples are batched and the LR that goes with them; saved with every
    checkpoint, so a resumed job keeps what the rescale callbacks made of it."""

    #: samples per optimizer step, over every data-parallel rank
    global_batch: int
    #: samples per forward/backward on one rank
    micro_batch: int = 1
    #: the base (peak) learning rate the schedule multiplies
    lr: float

    def __post_init__(self) -> None:
        if self.global_batch < 1 or self.micro_batch < 1 or not self.lr >= 0:
            raise ValueError(f"invalid batch plan {self}")

    def accumulation_steps(self, dp_size: int) -> int:
        """Micro-batches each rank runs per optimizer step at ``dp_size`` data-parallel ranks."""
        per_step = self.micro_batch * dp_size
        if self.global_batch % per_step:
            raise RescaleError(
                f"global batch {self.global_batch} is not a whole number of micro-batches of "
                f"{self.micro_batch} on {dp_size} data-parallel ranks"
            )
        return self.global_batch // per_step


@dataclass
class Rescale:
    """What a rescale callback sees; it may edit ``state`` in place and returns the new plan."""

    #: the step being restored
    step: int
    old: DpLayout
    new: DpLayout
    #: the restored training state, before the script loads it
    state: dict[str, Any]
    #: the plan saved with the checkpoint (None: the script gave none)
    saved_plan: BatchPlan | None
    #: the plan as the callbacks before this one left it
    plan: BatchPlan | None
    #: the names of the callbacks that ran, in order (reported in the job's events)
    applied: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float:
        """New data-parallel size over the old one."""
        return self.new.dp_size / self.old.dp_size

    def require_plan(self, rule: str) -> BatchPlan:
        if self.plan is None:
            raise RescaleError(f"{rule} needs the batch plan: pass plan= to TrainerShim.restore")
        return self.plan


#: a callback returns the plan in force after it (None: unchanged)
RescaleCallback = Callable[[Rescale], BatchPlan | None]


def keep_global_batch(rescale: Rescale) -> BatchPlan:
    """Same global batch and LR; each rank accumulates global / (micro × new DP) micro-batches."""
    plan = rescale.require_plan("keep_global_batch")
    plan.accumulation_steps(rescale.new.dp_size)
    return plan


def scale_lr(
    rule: Literal["linear", "sqrt"] = "linear",
    *,
    optimizer_key: str | None = "optimizer",
    scheduler_key: str | None = "scheduler",
) -> RescaleCallback:
    """Keep the per-rank batch and scale the LR by the DP ratio (``linear``) or its root.

    ``optimizer_key``/``scheduler_key`` name the optimizer's and LR scheduler's state dicts in
    the restored state; their LRs are scaled by the same factor (None: the script does it).
    A state without a scheduler at ``scheduler_key`` (the job has none) scales the
    optimizer's parameter groups alone.
    """
    if rule not in ("linear", "sqrt"):
        raise ValueError(f"unknown LR scaling rule {rule!r}: linear or sqrt")

    def scale(rescale: Rescale) -> BatchPlan:
        plan = rescale.require_plan(f"scale_lr({rule})")
        per_rank, remainder = divmod(plan.global_batch, rescale.old.dp_size)
        if remainder:
            raise RescaleError(
                f"global batch {plan.global_batch} was not shared by {rescale.old.dp_size} ranks"
            )
        factor = rescale.ratio if rule == "linear" else math.sqrt(rescale.ratio)
        if optimizer_key is not None:
            for group in _entry(rescale.state, optimizer_key)["param_groups"]:
                group["lr"] *= factor
                if "initial_lr" in group:
                    group["initial_lr"] *= factor
        # a job without an LR scheduler (none saved at the key) has only the optimizer's LRs
        scheduler = None if scheduler_key is None else _entry(rescale.state, scheduler_key, True)
        if scheduler is not None:
            for name in ("base_lrs", "_last_lr"):
                if name in scheduler:
                    scheduler[name] = [lr * factor for lr in scheduler[name]]
        return msgspec.structs.replace(
            plan, global_batch=per_rank * rescale.new.dp_size, lr=plan.lr * factor
        )

    scale.__name__ = f"scale_lr_{rule}"
    return scale


def adjust_schedule(*, scheduler_key: str = "scheduler") -> RescaleCallback:
    """Move the LR scheduler to the same number of samples seen under the new global batch.

    A schedule counted in steps (warmup, decay horizon) assumes a fixed global batch; after
    :func:`scale_lr` changed it, step n of the old run is step n × old / new of the new one.
    Takes effect from the scheduler's next step. Register it after the rule that changes the
    global batch.
    """

    def adjust(rescale: Rescale) -> BatchPlan | None:
        plan = rescale.require_plan("adjust_schedule")
        saved = rescale.saved_plan or plan
        scheduler = _entry(rescale.state, scheduler_key)
        if "last_epoch" not in scheduler:
            raise RescaleError(f"state[{scheduler_key!r}] is not an LR scheduler's state dict")
        position = round(scheduler["last_epoch"] * saved.global_batch / plan.global_batch)
        scheduler["last_epoch"] = position
        if "_step_count" in scheduler:
            scheduler["_step_count"] = position + 1
        return None

    adjust.__name__ = "adjust_schedule"
    return adjust


def _entry(state: dict[str, Any], key: str, optional: bool = False) -> Any:
    """The state dict at ``key``: a top-level key, or a dotted path through dicts and lists
    (``"optimizer_states.0"`` in a Lightning checkpoint). ``optional``: None where nothing
    is saved there (a Lightning module without a scheduler has ``lr_schedulers: []``)."""
    value: Any = state
    for part in key.split("."):
        if isinstance(value, dict):
            value = value.get(part)
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            value = None
    if value is None and optional:
        return None
    if not isinstance(value, dict):
        raise RescaleError(f"the restored state has no state dict under {key!r}")
    return value


def run_callbacks(callbacks: list[RescaleCallback], rescale: Rescale) -> BatchPlan | None:
    """Run ``callbacks`` in order on ``rescale``; the plan they leave must fit the new layout."""
    for callback in callbacks:
        result = callback(rescale)
        if result is not None:
            rescale.plan = result
        rescale.applied.append(getattr(callback, "__name__", type(callback).__name__))
    if rescale.plan is not None:
        rescale.plan.accumulation_steps(rescale.new.dp_size)
    return rescale.plan


#: the built-in rules by name, for command-line choices (the example job's ``--rescale``)
BUILTIN_RULES: dict[str, Callable[[], list[RescaleCallback]]] = {
    "keep-global-batch": lambda: [keep_global_batch],
    "linear-lr": lambda: [scale_lr("linear"), adjust_schedule()],
    "sqrt-lr": lambda: [scale_lr("sqrt"), adjust_schedule()],
}


def plan_event(
    config: ShimConfig,
    layout: DpLayout,
    step: int,
    plan: BatchPlan,
    applied: list[str],
    rescaled_from_dp: int,
) -> schemas.TrainingPlan:
    """What the job's events say of the batch and LR the job trains with from ``step``."""
    return schemas.TrainingPlan(
        job=config.job,
        node=config.node,
        rank=config.rank,
        step=step,
        world_size=layout.world_size,
        dp_size=layout.dp_size,
        global_batch=plan.global_batch,
        micro_batch=plan.micro_batch,
        accumulation_steps=plan.accumulation_steps(layout.dp_size),
        lr=plan.lr,
        rescaled_from_dp=rescaled_from_dp,
        callbacks=applied,
    )
