"""Launch the example GPT job as real rank processes, the way torchrun (or the runner) does."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tests import processes

# Small enough for a quick CPU run, big enough to learn: shared by the process tests
# (TINY_MODEL alone after goodput.examples.gpt.supervised_argv, which turns the log off).
TINY_MODEL = ["--n-layer", "2", "--d-model", "64"]
TINY_MODEL_ARGS = [*TINY_MODEL, "--log-every", "0"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class RankGroup:
    """One launch of the job: ``world_size`` rank processes sharing a rendezvous port."""

    processes: list[subprocess.Popen[bytes]]
    logs: list[Path]

    def wait(self, timeout_s: float = 180.0) -> list[int]:
        deadline = time.monotonic() + timeout_s
        codes = []
        for process in self.processes:
            try:
                codes.append(process.wait(timeout=max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"rank group hung; logs:\n{self.log_tails()}") from None
        return codes

    def kill(self) -> None:
        processes.kill(*self.processes)

    def log_tails(self, chars: int = 2000) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text()[-chars:]}" for log in self.logs)


class Launcher:
    """Starts rank groups and kills whatever is still running at teardown."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.groups: list[RankGroup] = []

    def start(self, world_size: int, args: Sequence[str]) -> RankGroup:
        port = free_port()
        processes, logs = [], []
        launch = len(self.groups)
        for rank in range(world_size):
            env = dict(
                os.environ,
                RANK=str(rank),
                LOCAL_RANK=str(rank),
                WORLD_SIZE=str(world_size),
                MASTER_ADDR="127.0.0.1",
                MASTER_PORT=str(port),
            )
            log = self.log_dir / f"launch{launch}-rank{rank}.log"
            with open(log, "wb") as log_file:
                processes.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "goodput.examples.gpt.train", *args],
                        env=env,
                        stdout=log_file,
                        stderr=subprocess.STDOUT,
                    )
                )
            logs.append(log)
        group = RankGroup(processes, logs)
        self.groups.append(group)
        return group

    def run(self, world_size: int, args: Sequence[str], timeout_s: float = 180.0) -> None:
        group = self.start(world_size, args)
        codes = group.wait(timeout_s)
        assert codes == [0] * world_size, f"exit codes {codes}; logs:\n{group.log_tails()}"

    def close(self) -> None:
        for group in self.groups:
            group.kill()


def read_result(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def load_final_params(ckpt_dir: Path, step: int) -> dict[str, torch.Tensor]:
    state = torch.load(ckpt_dir / f"step-{step:08d}.pt", weights_only=True)
    return state["model"]


def wait_for_file(path: Path, group: RankGroup, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if any(process.poll() is not None for process in group.processes):
            raise AssertionError(f"a rank exited before {path.name}; logs:\n{group.log_tails()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {path.name} after {timeout_s} s; logs:\n{group.log_tails()}")
        time.sleep(0.05)
