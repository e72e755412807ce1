"""What ``TrainerShim.restore`` hands back, and the record a checkpoint keeps about itself.

A checkpoint written through the shim carries, next to the user's state, the world size and
data-parallel layout it was saved under and the batch plan in force (one reserved top-level
key, :data:`METADATA_KEY`). Restore reads them back so a resumed job can tell that the
data-parallel size changed and run the rescale callbacks (:mod:`goodput.shim.rescale`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from goodput.schemas.tiers import RestoreSource
from goodput.shim.dp_layout import DpLayout
from goodput.shim.rescale import BatchPlan, Rescale, RescaleCallback, run_callbacks

#: the top-level key of a saved state that holds goodput's record of it (not the user's data)
METADATA_KEY = "__goodput__"


class CheckpointMetadata(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Saved with every checkpoint under :data:`METADATA_KEY`."""

    format: int = 1
    layout: DpLayout
    plan: BatchPlan | None = None


def with_metadata(state: dict[str, Any], metadata: CheckpointMetadata) -> dict[str, Any]:
    """A shallow copy of ``state`` that also holds ``metadata`` (no tensor is copied)."""
    if METADATA_KEY in state:
        raise ValueError(f"the training state may not use the reserved key {METADATA_KEY!r}")
    return {**state, METADATA_KEY: msgspec.to_builtins(metadata)}


def pop_metadata(state: dict[str, Any]) -> CheckpointMetadata | None:
    """Take goodput's record out of a restored state (None: saved without one)."""
    raw = state.pop(METADATA_KEY, None)
    if raw is None:
        return None
    try:
        return msgspec.convert(raw, CheckpointMetadata)
    except msgspec.ValidationError as exc:
        raise ValueError(f"checkpoint metadata {METADATA_KEY!r} is unreadable: {exc}") from None


class UnfilledVolumeError(RuntimeError):
    """Some ranks hold a checkpoint and others none: a node's volume was not refilled before
    the launch. Starting over from step 0 would throw away every step since the job began."""


class UnrestorableCheckpointError(RuntimeError):
    """The ranks hold checkpoints, but some rank could restore none of them intact at or
    before the step the others offer: no step every rank can load. Starting over from step 0
    would throw away every step since the job began, so every rank refuses together."""


@dataclass(frozen=True)
class RestoreResult:
    """A restored checkpoint: the step, the state and what it was saved under."""

    #: completed steps when it was saved: training goes on with step + 1
    step: int
    #: the user's state, loaded into the template's tensors (metadata removed)
    state: dict[str, Any]
    #: where the bytes were read: the node's own volume ("local"; peers and the object store
    #: fill it before the ranks start), the directory every node shares ("shared": torch-save),
    #: or the engine's host buffer after an in-process restart ("host"); what the rank's
    #: ``CheckpointRestored`` event says too
    tier: RestoreSource
    #: the layout of the ranks that saved it; None for a checkpoint saved without one
    saved_layout: DpLayout | None
    #: the layout of the ranks restoring it
    layout: DpLayout
    #: the batch plan in force from now on: the saved one after the rescale callbacks (or the
    #: plan given to ``restore`` when the checkpoint has none)
    plan: BatchPlan | None
    #: the data-parallel size changed and the rescale callbacks ran
    rescaled: bool = False


def resolve_restore(
    step: int,
    state: dict[str, Any],
    *,
    tier: RestoreSource,
    layout: DpLayout,
    plan: BatchPlan | None,
    callbacks: list[RescaleCallback],
) -> tuple[RestoreResult, list[str]]:
    """Read the checkpoint's metadata out of ``state`` and, when the data-parallel size changed,
    run the rescale ``callbacks``; returns the result and the names of the callbacks that ran."""
    metadata = pop_metadata(state)
    saved_layout = metadata.layout if metadata is not None else None
    saved_plan = metadata.plan if metadata is not None and metadata.plan is not None else plan
    if saved_layout is None or saved_layout.dp_size == layout.dp_size:
        result = RestoreResult(step, state, tier, saved_layout, layout, saved_plan)
        return result, []
    rescale = Rescale(
        step=step, old=saved_layout, new=layout, state=state, saved_plan=saved_plan, plan=saved_plan
    )
    new_plan = run_callbacks(callbacks, rescale)
    result = RestoreResult(step, state, tier, saved_layout, layout, new_plan, rescaled=True)
    return result, rescale.applied
