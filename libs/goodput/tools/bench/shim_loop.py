"""One rank of ``goodput bench shim``: the same training loop with and without the shim.

Every rank of the run is a process forming one group (gloo on the CPU; ``cpu:gloo,cuda:nccl``
with the model on a GPU, as a job whose control collectives stay on the host), trains its own
copy of an MLP (no gradient all-reduce: the shim's collectives are the only ones, so what they
cost is not hidden behind the model's), and runs each mode for a block of steps, every rank
the same modes in the same order. Rank 0 times each block from a device sync to a device sync
(on a GPU a step's host sync shows as the device idling, not as host time), so a mode's
per-step overhead is its block's time less the plain loop's, over the steps:

* ``plain``: forward, backward, optimizer step — no goodput;
* ``shim``: the same plus ``end_step`` with a ``TrainerShim`` (step report, the pipelined
  stop vote, the schedule's agreement ballot every 10 steps), no checkpoint;
* ``shim_save``: the same with one save in the block, overlapped (``shim.guard``): the copy
  runs during the next forward/backward, the optimizer step waits for it;
* ``shim_save_blocking``: one save in the block, its copy inside the call (no guard);
* ``vote_blocking``: ``shim`` with the stop voted as before the pipelined vote (a blocking
  all-reduce of "checkpoint, stop" at every step), for the vote's share;
* ``shim_numerics``: ``shim`` with every step's loss and gradient norm given to the numerics
  monitor (accumulated on the device, a window read every :func:`numerics_every` steps) and
  the replicas' parameters fingerprinted and compared once a block — more often than the
  default of every 100 steps, so its share is an upper bound. Every rank's copy of the MLP
  starts from the same seed and trains on the same batch: the ranks are replicas, and agree.
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from goodput.shim.agree import any_rank
from goodput.shim.config import ShimConfig
from goodput.shim.step_protocol import end_step
from goodput.shim.stop_vote import StopVote
from goodput.shim.trainer import TrainerShim

MODES = ("plain", "shim", "shim_save", "shim_save_blocking", "vote_blocking", "shim_numerics")
SAVING = ("shim_save", "shim_save_blocking")


@dataclass(frozen=True)
class LoopSpec:
    device: str
    width: int
    depth: int
    batch: int
    steps: int
    repeats: int
    world: int
    port: int


@dataclass
class _Mode:
    """One mode's own model, optimizer, shim and vote (a guard stays on its optimizer)."""

    name: str
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    shim: TrainerShim | None
    vote: StopVote
    step: int
    #: numerics windows whose replicas' fingerprints agreed (``shim_numerics``)
    fingerprints_agreed: int = 0

    def state(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}


def _model(spec: LoopSpec) -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(spec.depth):
        layers += [torch.nn.Linear(spec.width, spec.width), torch.nn.GELU()]
    return torch.nn.Sequential(*layers).to(spec.device)


def numerics_every(steps: int) -> int:
    """The numerics window of a block of ``steps`` (a window must end inside it)."""
    return 10 if steps % 10 == 0 else steps


def _train_step(mode: _Mode, batch: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The step's loss, and its gradient norm where the mode reports one (a loop that clips
    has it anyway: ``clip_grad_norm_`` with no limit only measures)."""
    loss = mode.model(batch).square().mean()
    loss.backward()
    grad_norm = None
    if mode.name == "shim_numerics":
        grad_norm = torch.nn.utils.clip_grad_norm_(mode.model.parameters(), math.inf)
    mode.optimizer.step()
    mode.optimizer.zero_grad(set_to_none=True)
    return loss, grad_norm


def _blocking_vote_end(mode: _Mode, step: int, state: Callable[[], dict[str, Any]]) -> None:
    """The step's end as the vote was before it was pipelined: both flags, blocking."""
    assert mode.shim is not None
    mode.shim.step_done(step, 0.0, 0, 0.0)
    checkpoint, stop = any_rank(mode.shim.should_checkpoint(step), mode.shim.should_stop())
    if checkpoint or stop:
        mode.shim.save(state(), step)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _block(mode: _Mode, spec: LoopSpec, batch: torch.Tensor) -> float:
    """``spec.steps`` steps of ``mode``; seconds from a device sync to a device sync."""
    _sync(spec.device)
    started = time.perf_counter()
    for _ in range(spec.steps):
        loss, grad_norm = _train_step(mode, batch)
        mode.step += 1
        if mode.shim is None:
            continue
        if mode.name == "shim_numerics":
            window = mode.shim.numerics.observe(mode.step, loss, grad_norm, mode.model.parameters)
            mode.fingerprints_agreed += window is not None and window.fingerprint is not None
        if mode.name == "vote_blocking":
            _blocking_vote_end(mode, mode.step, mode.state)
            continue
        # the loss is not read back: the loop reports it as a device tensor would cost it
        end_step(
            mode.shim,
            mode.step,
            step_time_s=0.0,
            tokens=0,
            loss=0.0,
            state=mode.state,
            vote=mode.vote,
        )
    _sync(spec.device)
    return time.perf_counter() - started


def _modes(spec: LoopSpec, rank: int, root: Path) -> list[_Mode]:
    modes = []
    for name in MODES:
        model = _model(spec)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        shim = None
        if name != "plain":
            # one save per block, half way: ``steps // 2`` steps done before the first block
            config = ShimConfig(
                job="bench-shim",
                rank=rank,
                world_size=spec.world,
                ckpt_dir=str(root / name / str(rank)),
                ckpt_every=spec.steps if name in SAVING else 0,
                keep_last=1,
                numerics_every=numerics_every(spec.steps),
                fingerprint_every=spec.steps,
            )
            shim = TrainerShim(config, install_signal_handlers=False)
            if name == "shim_save":
                shim.guard(optimizer)
        mode = _Mode(name, model, optimizer, shim, StopVote(), step=spec.steps // 2)
        _train_step(mode, torch.zeros(1, spec.width, device=spec.device))  # Adam's moments
        if shim is not None:
            shim.restore(mode.state())  # nothing to restore; prepares the save's buffer
        modes.append(mode)
    return modes


def command(rank: int, spec: LoopSpec) -> list[str]:
    """The command line of rank ``rank``'s process."""
    return [sys.executable, "-m", __name__, str(rank), json.dumps(asdict(spec))]


def _say(kind: str, value: Any) -> None:
    """A word to the driver: one JSON line on stdout (rank 0's is read)."""
    print(json.dumps([kind, value]), flush=True)


def run_rank(rank: int, spec: LoopSpec) -> None:
    """Rank ``rank``'s whole run; rank 0 tells its progress and timings on stdout."""
    backend = "cpu:gloo,cuda:nccl" if spec.device.startswith("cuda") else "gloo"
    if spec.device.startswith("cuda"):
        torch.cuda.set_device(torch.device(spec.device).index or 0)
    dist.init_process_group(
        backend,
        init_method=f"tcp://127.0.0.1:{spec.port}",
        rank=rank,
        world_size=spec.world,
        timeout=timedelta(seconds=300),
    )
    with tempfile.TemporaryDirectory(prefix="goodput-bench-shim-") as tmp:
        modes = _modes(spec, rank, Path(tmp))
        batch = torch.randn(spec.batch, spec.width, device=spec.device)
        for mode in modes:
            _block(mode, spec, batch)  # warm-up: allocator, first collectives, first save
        seconds: dict[str, list[float]] = {mode.name: [] for mode in modes}
        for repeat in range(spec.repeats):
            for mode in modes:
                seconds[mode.name].append(_block(mode, spec, batch))
            if rank == 0:
                _say("progress", repeat + 1)
        for mode in modes:
            if mode.shim is not None:
                mode.shim.finish(mode.state(), mode.step)
        if rank == 0:
            state_bytes = sum(
                t.numel() * t.element_size()
                for t in [*modes[0].model.parameters(), *_moments(modes[0].optimizer)]
            )
            votes = {m.name: (m.vote.launched, m.vote.waited) for m in modes if m.shim}
            fingerprints = next(m.fingerprints_agreed for m in modes if m.name == "shim_numerics")
            _say(
                "done",
                {
                    "seconds": seconds,
                    "state_bytes": state_bytes,
                    "votes": votes,
                    "fingerprints_agreed": fingerprints,
                },
            )
    # leave together, over the host (a mixed group's barrier might set up NCCL, which two
    # ranks on one GPU cannot): a rank leaving while its peer's gloo threads talk aborts it
    dist.all_reduce(torch.zeros(1))
    dist.destroy_process_group()


def _moments(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]


if __name__ == "__main__":
    run_rank(int(sys.argv[1]), LoopSpec(**json.loads(sys.argv[2])))
