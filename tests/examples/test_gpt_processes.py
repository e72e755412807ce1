"""The example job as real rank processes: restarts, kills, SIGTERM and rescales.

Same world size must resume bit-exactly (equal parameter hashes); a different world size keeps
the global batch by gradient accumulation and must stay numerically close.
"""

from __future__ import annotations

import math
import signal
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from tests.examples.launch import (
    TINY_MODEL_ARGS,
    Launcher,
    load_final_params,
    read_result,
    wait_for_file,
)

pytestmark = pytest.mark.slow

STEPS, CKPT_EVERY, STOP_AT = 40, 8, 12


def job_args(ckpt_dir: Path, result: Path, *extra: str) -> list[str]:
    return [
        *("--steps", str(STEPS), "--ckpt-every", str(CKPT_EVERY), "--seed", "3"),
        *("--ckpt-dir", str(ckpt_dir), "--result", str(result)),
        *TINY_MODEL_ARGS,
        *extra,
    ]


@dataclass
class Run:
    ckpt_dir: Path
    result_path: Path

    @property
    def result(self) -> dict:
        return read_result(self.result_path)

    def losses(self) -> dict[int, float]:
        return {step: loss for step, loss in self.result["losses"]}


class References:
    """Uninterrupted runs per world size, each computed once per module when first needed."""

    def __init__(self, launcher: Launcher, root: Path) -> None:
        self.launcher = launcher
        self.root = root
        self.runs: dict[int, Run] = {}

    def __getitem__(self, world_size: int) -> Run:
        if world_size not in self.runs:
            run = Run(self.root / f"ref{world_size}", self.root / f"ref{world_size}.json")
            self.launcher.run(world_size, job_args(run.ckpt_dir, run.result_path))
            assert run.result["completed"] and run.result["steps"] == STEPS
            self.runs[world_size] = run
        return self.runs[world_size]


@pytest.fixture(scope="module")
def references(module_launcher: Launcher, tmp_path_factory: pytest.TempPathFactory) -> References:
    return References(module_launcher, tmp_path_factory.mktemp("references"))


def assert_close_to(run: Run, reference: Run) -> None:
    """Same global batches, different rounding: losses and parameters agree closely."""
    losses, reference_losses = run.losses(), reference.losses()
    for step, loss in losses.items():
        assert math.isclose(loss, reference_losses[step], rel_tol=1e-3), (step, loss)
    params = load_final_params(run.ckpt_dir, STEPS)
    reference_params = load_final_params(reference.ckpt_dir, STEPS)
    for name, value in params.items():
        torch.testing.assert_close(value, reference_params[name], rtol=1e-3, atol=1e-4)


def assert_loss_keeps_falling(run: Run) -> None:
    losses = [loss for _, loss in sorted(run.losses().items())]
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.1, losses


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_stop_and_resume_is_bit_exact(
    world_size: int, launcher: Launcher, references: References, tmp_path: Path
) -> None:
    run = Run(tmp_path / "ckpt", tmp_path / "result.json")
    launcher.run(
        world_size, job_args(run.ckpt_dir, run.result_path, "--exit-at-step", str(STOP_AT))
    )
    assert run.result["steps"] == STOP_AT and not run.result["completed"]
    assert (run.ckpt_dir / f"step-{STOP_AT:08d}.pt").exists()  # saved on the way out

    launcher.run(world_size, job_args(run.ckpt_dir, run.result_path))
    assert run.result["first_step"] == STOP_AT and run.result["completed"]
    assert run.result["params_sha256"] == references[world_size].result["params_sha256"]


@pytest.mark.parametrize("killed_rank", [0, 1])  # 0 is the checkpoint writer
def test_kill9_of_one_rank_then_group_restart_is_bit_exact(
    killed_rank: int, launcher: Launcher, references: References, tmp_path: Path
) -> None:
    run = Run(tmp_path / "ckpt", tmp_path / "result.json")
    group = launcher.start(2, job_args(run.ckpt_dir, run.result_path))
    wait_for_file(run.ckpt_dir / f"step-{CKPT_EVERY:08d}.pt", group)
    group.processes[killed_rank].send_signal(signal.SIGKILL)
    codes = group.wait()
    assert codes[killed_rank] == -signal.SIGKILL
    assert codes[1 - killed_rank] != 0, "the survivor must fail on the lost peer, not go on alone"
    assert not run.result_path.exists()

    launcher.run(2, job_args(run.ckpt_dir, run.result_path))
    assert 0 < run.result["first_step"] < STEPS
    assert run.result["params_sha256"] == references[2].result["params_sha256"]


def test_sigterm_to_one_rank_stops_the_whole_group_with_a_checkpoint(
    launcher: Launcher, references: References, tmp_path: Path
) -> None:
    run = Run(tmp_path / "ckpt", tmp_path / "result.json")
    group = launcher.start(2, job_args(run.ckpt_dir, run.result_path))
    wait_for_file(run.ckpt_dir / f"step-{CKPT_EVERY:08d}.pt", group)
    group.processes[1].send_signal(signal.SIGTERM)
    assert group.wait() == [0, 0], group.log_tails()
    stopped_at = run.result["steps"]
    assert not run.result["completed"] and CKPT_EVERY <= stopped_at < STEPS
    assert (run.ckpt_dir / f"step-{stopped_at:08d}.pt").exists()

    launcher.run(2, job_args(run.ckpt_dir, run.result_path))
    assert run.result["first_step"] == stopped_at
    assert run.result["params_sha256"] == references[2].result["params_sha256"]


@pytest.mark.parametrize(("old_world", "new_world"), [(2, 1), (1, 3)])
def test_rescale_keeps_global_batch_and_stays_close(
    old_world: int, new_world: int, launcher: Launcher, references: References, tmp_path: Path
) -> None:
    run = Run(tmp_path / "ckpt", tmp_path / "result.json")
    launcher.run(old_world, job_args(run.ckpt_dir, run.result_path, "--exit-at-step", str(STOP_AT)))
    launcher.run(new_world, job_args(run.ckpt_dir, run.result_path))
    result = run.result
    assert result["first_step"] == STOP_AT and result["completed"]
    assert result["world_size"] == new_world and result["global_batch"] == 12
    assert result["lr"] == 3e-3 and result["accumulation_steps"] == 12 // new_world
    assert_loss_keeps_falling(run)
    assert_close_to(run, references[old_world])
