"""Run a training script killed and resumed under `goodput run`, and once uninterrupted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tests.conftest import goodput_cli

WRAPPER = Path(__file__).with_name("supervised_wrapper.py")
REPO = Path(__file__).resolve().parents[2]
FIRST_BEAT_S = 300.0


@dataclass
class Outcome:
    summary: dict[str, Any]
    final: dict[str, Any]
    #: (attempt, restored step) per attempt of rank 0
    restored: list[tuple[int, int]]


def _pythonpath() -> str:
    paths = [str(REPO / "libs"), str(REPO / "services"), str(REPO)]
    return os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")])


def run_plain(script: Path, workdir: Path, timeout_s: float = 400) -> dict[str, Any]:
    """The script on its own (no supervisor, no bus), checkpoints under ``workdir``."""
    workdir.mkdir(parents=True, exist_ok=True)
    result = workdir / "final.pt"
    env = {k: v for k, v in os.environ.items() if not k.startswith("GOODPUT_")}
    env |= {"INTEG_RESULT": str(result), "PYTHONPATH": _pythonpath()}
    subprocess.run(
        [sys.executable, str(WRAPPER), str(script)],
        cwd=workdir,
        env=env,
        check=True,
        timeout=timeout_s,
        capture_output=True,
    )
    return torch.load(result, weights_only=False)


def run_killed_and_resumed(
    script: Path,
    workdir: Path,
    *,
    kill_at_step: int,
    ckpt_every: int,
    timeout_s: float = 400,
    nodes: int = 1,
) -> Outcome:
    """The script under `goodput run` on ``nodes`` nodes: rank 0 of attempt 1 is SIGKILLed
    after ``kill_at_step``; the supervisor restarts it and it resumes from its checkpoint."""
    workdir.mkdir(parents=True, exist_ok=True)
    result = workdir / "final.pt"
    completed = goodput_cli(
        *("run", "--nodes", str(nodes), "--spares", "0", "--json"),
        *("--ckpt-every", str(ckpt_every), "--timeout", str(timeout_s - 60)),
        *("--state-dir", str(workdir / "stack"), "--job", "integ"),
        *("--env", f"INTEG_KILL_AT_STEP={kill_at_step}", "--env", f"INTEG_RESULT={result}"),
        *("--env", f"PYTHONPATH={_pythonpath()}"),
        # importing a framework on a busy machine can take over the sensor's default 60 s
        # before the shim's first heartbeat; this test is about resuming, not detection
        *("--service-set", f"sensor:thresholds={{first_heartbeat_timeout_s={FIRST_BEAT_S}}}"),
        *("--", sys.executable, str(WRAPPER), str(script)),
        timeout=timeout_s,
        check=False,
    )
    summary = json.loads(completed.stdout) if completed.stdout.strip() else {}
    assert completed.returncode == 0 and summary.get("state") == "finished", (
        f"goodput run exited {completed.returncode}\n{completed.stdout}\n{completed.stderr[-4000:]}"
        + _rank_logs(workdir / "stack")
    )
    restored = [
        (int(attempt), int(step))
        for attempt, step in (
            line.split() for line in Path(f"{result}.restored").read_text().splitlines()
        )
    ]
    return Outcome(summary, torch.load(result, weights_only=False), restored)


def _rank_logs(state_dir: Path) -> str:
    logs = sorted(state_dir.rglob("*.log"))
    return "".join(f"\n--- {p}\n{p.read_text(errors='replace')[-3000:]}" for p in logs)


def assert_identical(actual: Any, expected: Any, where: str = "state") -> None:
    """Every tensor bit for bit, every other value equal, the same structure."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), where
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, where
        assert torch.equal(actual, expected), f"{where} differs"
    elif isinstance(expected, np.ndarray):  # numpy's RNG state (the HF Trainer saves it)
        assert isinstance(actual, np.ndarray) and actual.dtype == expected.dtype, where
        assert np.array_equal(actual, expected), f"{where} differs"
    elif isinstance(expected, dict):
        assert isinstance(actual, dict) and set(actual) == set(expected), where
        for key in expected:
            assert_identical(actual[key], expected[key], f"{where}[{key!r}]")
    elif isinstance(expected, list | tuple):
        assert len(actual) == len(expected), where
        for index, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_identical(a, e, f"{where}[{index}]")
    else:
        assert actual == expected, f"{where}: {actual!r} != {expected!r}"


#: 5 steps of a global batch of 8 per epoch: checkpoints at 3, 4 and 7 fall mid-epoch
SAMPLES = 40


class Indexed(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Sample i is (i, features): the test sees which samples each step trained on."""

    def __init__(self) -> None:
        self.features = torch.randn(SAMPLES, 4, generator=torch.Generator().manual_seed(1))

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.tensor(index), self.features[index]
