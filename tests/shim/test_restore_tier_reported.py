"""A restore is published as read from where ``RestoreResult`` says it was read.

A torch-save checkpoint lives in the directory every node shares: the shim's result said
"shared" while the rank's ``CheckpointRestored`` said "local" (issue 40). The real shim and
engines, no bus: every event the rank publishes reaches its telemetry, which is watched."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from goodput import schemas
from goodput.shim import ShimConfig, TrainerShim


def _shim(directory: Path, mode: str) -> tuple[TrainerShim, list[schemas.CheckpointRestored]]:
    shim = TrainerShim(
        ShimConfig(ckpt_dir=str(directory), world_size=1, ckpt_mode=mode),  # type: ignore[arg-type]
        install_signal_handlers=False,
    )
    restored: list[schemas.CheckpointRestored] = []
    observe = shim.telemetry.observe

    def watch(event: schemas.Event) -> None:
        if isinstance(event, schemas.CheckpointRestored):
            restored.append(event)
        observe(event)

    shim.telemetry.observe = watch  # type: ignore[method-assign]
    return shim, restored


@pytest.mark.parametrize(("mode", "tier"), [("torch-save", "shared"), ("async", "local")])
def test_the_published_tier_is_the_result_s(tmp_path: Path, mode: str, tier: str) -> None:
    first, _ = _shim(tmp_path, mode)
    first.finish({"w": torch.arange(3.0)}, 4)  # saves step 4, waits until durable
    shim, published = _shim(tmp_path, mode)
    try:
        result = shim.restore({"w": torch.zeros(3)})
        assert result is not None and result.step == 4
        assert torch.equal(result.state["w"], torch.arange(3.0))
        assert result.tier == tier
        assert [(e.step, e.tier) for e in published] == [(4, result.tier)]
    finally:
        shim.finish({"w": torch.zeros(3)}, 4)
