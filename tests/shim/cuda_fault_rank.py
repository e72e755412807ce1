"""A supervised rank whose steps run on a FakeCudaContext (tests/shim/fake_cuda.py): the shim's
own loop (``TrainerShim.run``) on a real one-rank gloo group, a real bus link and a real
checkpoint engine. ``scenario``: ``assert`` (a device-side assert at step 3), ``oom`` (step 3
needs more memory than the GPU has, every time) or ``transient-oom`` (only the first time).

Run: python -m tests.shim.cuda_fault_rank <nats url> <ckpt dir> <rendezvous port> <scenario>
"""

from __future__ import annotations

import logging
import sys
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from goodput.bus import BusSettings
from goodput.shim import ShimConfig, TrainerShim
from goodput.shim.inprocess import RunOutcome
from tests.shim.fake_cuda import FakeCudaContext

FAILING_STEP = 3
MEMORY = 1 << 30


class FakeCudaJob:
    """A ResumableJob whose tensors live on the fake context: every step, save and restore
    calls it, as a real job's CUDA tensors would."""

    tokens_per_step = 1
    last_compute_time_s = 0.0
    plan = None

    def __init__(self, cuda: FakeCudaContext, scenario: str) -> None:
        self.cuda, self.scenario = cuda, scenario
        self.step = 0
        self.weight = torch.zeros(4)
        self.ooms = 0

    def state_dict(self) -> dict[str, Any]:
        self.cuda.call()
        return {"step": self.step, "weight": self.weight}

    def load_state_dict(self, state: dict[str, Any], plan: Any = None) -> None:
        self.cuda.call()
        self.step = int(state["step"])
        self.weight.copy_(state["weight"])

    def train_step(self, slowdown: float = 1.0) -> float:
        if self.step + 1 == FAILING_STEP:
            if self.scenario == "assert":
                self.cuda.fail_sticky()
            if self.scenario == "oom" or (self.scenario == "transient-oom" and not self.ooms):
                self.ooms += 1
                self.cuda.allocate(2 * MEMORY)
        self.cuda.allocate(MEMORY // 2)
        self.weight += 1
        dist.all_reduce(self.weight)
        self.step += 1
        return float(self.weight[0])

    def release_group(self) -> None:
        pass

    def regroup(self) -> None:
        pass


def main() -> RunOutcome:
    url, root, port, scenario = sys.argv[1:5]
    logging.basicConfig(level=logging.INFO, format="%(name)s %(levelname)s %(message)s")
    dist.init_process_group(
        "gloo",
        rank=0,
        world_size=1,
        init_method=f"tcp://127.0.0.1:{port}",
        timeout=timedelta(seconds=60),
    )
    config = ShimConfig(
        job="cuda", node="node-0", ckpt_dir=root, ckpt_every=1, bus=BusSettings(url=url)
    )
    shim = TrainerShim(config, install_signal_handlers=False)
    assert shim.link is not None and shim.link.connected.wait(60)  # a Rejoin can reach it
    outcome = shim.run(FakeCudaJob(FakeCudaContext(MEMORY), scenario), 6)
    print(f"finished at step {outcome.step} after {outcome.restarts} restart(s)", flush=True)
    return outcome


if __name__ == "__main__":
    main()
