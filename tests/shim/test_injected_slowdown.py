"""The shim's injected straggler: an InjectFault "slow" sets the factor the training loop asks
for, only where fault injection is enabled, until cleared or its duration ends."""

from __future__ import annotations

import time
from pathlib import Path

from goodput import schemas
from goodput.shim.trainer import ShimConfig, TrainerShim


def shim(tmp_path: Path, injectable: bool = True) -> TrainerShim:
    config = ShimConfig(
        job="j", node="node-1", rank=1, ckpt_dir=str(tmp_path), enable_fault_injection=injectable
    )
    return TrainerShim(config, install_signal_handlers=False)


def slow(**fields) -> schemas.InjectFault:
    return schemas.InjectFault(job="j", node="node-1", fault="slow", **fields)


def test_slow_sets_the_compute_factor_until_cleared(tmp_path: Path) -> None:
    trainer = shim(tmp_path)
    assert trainer.compute_slowdown() == 1.0
    trainer._on_command(slow(factor=1.5, detail="1"))
    assert trainer.compute_slowdown() == 1.5
    trainer._on_command(slow(clear=True))
    assert trainer.compute_slowdown() == 1.0


def test_slow_ends_after_its_duration(tmp_path: Path) -> None:
    trainer = shim(tmp_path)
    trainer._on_command(slow(factor=2.0, duration_s=0.05))
    assert trainer.compute_slowdown() == 2.0
    time.sleep(0.06)
    assert trainer.compute_slowdown() == 1.0


def test_slow_for_another_rank_or_node_or_without_injection_is_ignored(tmp_path: Path) -> None:
    trainer = shim(tmp_path)
    trainer._on_command(slow(factor=2.0, detail="0"))
    trainer._on_command(schemas.InjectFault(job="j", node="node-0", fault="slow", factor=2.0))
    assert trainer.compute_slowdown() == 1.0
    refusing = shim(tmp_path, injectable=False)
    refusing._on_command(slow(factor=2.0))
    assert refusing.compute_slowdown() == 1.0
