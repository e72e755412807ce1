"""``train.main`` in this process (world size 1): result file, bad input, swapping the hooks."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from goodput.examples.gpt.local_hooks import snapshot
from goodput.examples.gpt.train import DistInfo, main
from goodput.shim.dp_layout import DpLayout
from goodput.shim.rescale import BatchPlan, RescaleCallback
from goodput.shim.restore_result import RestoreResult
from tests.examples.launch import TINY_MODEL_ARGS, read_result


def test_result_file_describes_the_run(tmp_path: Path) -> None:
    args = ["--steps", "4", "--ckpt-every", "2", "--ckpt-dir", str(tmp_path / "ckpt")]
    assert main([*args, "--result", str(tmp_path / "r.json"), *TINY_MODEL_ARGS]) == 0
    result = read_result(tmp_path / "r.json")
    assert result["steps"] == 4 and result["completed"] and result["world_size"] == 1
    assert len(result["params_sha256"]) == 64
    assert [step for step, _ in result["losses"]] == [1, 2, 3, 4]
    assert result["final_loss"] == result["losses"][-1][1] and result["mean_step_time_s"] > 0


def _run(tmp_path: Path, name: str, *extra: str) -> dict[str, Any]:
    args = ["--steps", "6", "--ckpt-every", "2", "--ckpt-dir", str(tmp_path / name)]
    assert main([*args, "--result", str(tmp_path / f"{name}.json"), *TINY_MODEL_ARGS, *extra]) == 0
    return read_result(tmp_path / f"{name}.json")


def test_skipped_steps_are_counted_but_not_trained_on(tmp_path: Path) -> None:
    """What a loss spike's rollback does to the batches of its window (GOODPUT_SKIP_STEPS):
    the run ends at the same step, trained on every batch but those."""
    skipped = _run(tmp_path, "skipped", "--skip-steps", "3-4")
    again = _run(tmp_path, "again", "--skip-steps", "3-4")
    whole = _run(tmp_path, "whole")
    assert skipped["steps"] == whole["steps"] == 6 and skipped["skipped_steps"] == [3, 4]
    assert [step for step, _ in skipped["losses"]] == [1, 2, 5, 6]
    # the steps before the window are the whole run's; after it, the model differs
    assert skipped["losses"][:2] == whole["losses"][:2]
    assert skipped["params_sha256"] != whole["params_sha256"]
    assert skipped["params_sha256"] == again["params_sha256"]  # and deterministically so


@pytest.mark.parametrize("bad", ["4-3", "0-2", "3", "a-b", "3-4-5"])
def test_a_step_window_that_does_not_parse_is_refused(tmp_path: Path, bad: str) -> None:
    with pytest.raises(SystemExit) as refused:
        main(["--ckpt-dir", str(tmp_path), "--skip-steps", bad])
    assert refused.value.code == 2  # argparse's one line


def test_batch_that_does_not_split_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="micro-batch"):
        main(["--ckpt-dir", str(tmp_path), "--global-batch", "7", "--micro-batch", "2"])


class InMemoryHooks:
    """Another TrainingHooks implementation: checkpoints kept in a dict."""

    def __init__(self) -> None:
        self.saved: dict[int, dict[str, Any]] = {}
        self.steps: list[int] = []
        self.compute_times: list[float] = []

    def on_rescale(self, callback: RescaleCallback) -> RescaleCallback:
        return callback  # one world size only: never called

    def restore(
        self, template_state: dict[str, Any], plan: BatchPlan | None = None
    ) -> RestoreResult | None:
        if not self.saved:
            return None
        step = max(self.saved)
        layout = DpLayout(world_size=1, dp_size=1)
        return RestoreResult(step, self.saved[step], "local", layout, layout, plan)

    def step_done(
        self, step: int, step_time_s: float, tokens: int, loss: float, compute_time_s: float = 0.0
    ) -> None:
        self.steps.append(step)
        self.compute_times.append(compute_time_s)

    def skips_data(self, step: int) -> bool:
        return False

    def compute_slowdown(self) -> float:
        return 1.0

    def should_checkpoint(self, step: int) -> bool:
        return step == 2

    def save(self, state: dict[str, Any], step: int) -> None:
        self.saved[step] = snapshot(state)

    def should_stop(self) -> bool:
        return False

    def finish(self, state: dict[str, Any], step: int) -> None:
        self.save(state, step)


def test_hooks_are_swapped_by_the_factory(tmp_path: Path) -> None:
    memory = InMemoryHooks()

    def factory(args: argparse.Namespace, info: DistInfo) -> InMemoryHooks:
        assert info == DistInfo(rank=0, local_rank=0, world_size=1)
        return memory

    argv = ["--steps", "3", "--ckpt-dir", str(tmp_path / "unused"), *TINY_MODEL_ARGS]
    assert main(argv, hooks_factory=factory) == 0
    assert memory.steps == [1, 2, 3] and sorted(memory.saved) == [2, 3]
    # the loop reports each step's own compute time, for straggler detection
    assert len(memory.compute_times) == 3 and all(t > 0 for t in memory.compute_times)
    assert not (tmp_path / "unused").exists()
