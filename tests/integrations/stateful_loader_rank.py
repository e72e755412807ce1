"""One rank of a node of two, training the plain loop on torchdata's ``StatefulDataLoader``.

``python -m tests.integrations.stateful_loader_rank RANK WORLD OUT`` (rendezvous from
MASTER_ADDR and MASTER_PORT; :func:`run_node` starts both). The ranks form a gloo group and
average their gradients (data parallel), share one checkpoint directory (one node's volume)
and each shuffle with a generator of their own, so their loaders' positions differ: an
uninterrupted run, then one stopped mid-epoch and resumed. Writes what each step trained on
and the final states to ``OUT/rank-RANK.pt``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import RandomSampler

from goodput.integrations.loop import SupervisedLoop
from goodput.shim import BatchPlan, ShimConfig, TrainerShim
from tests.examples.launch import free_port
from tests.integrations.harness import Indexed

REPO = Path(__file__).resolve().parents[2]
PLAN = BatchPlan(global_batch=8, micro_batch=4, lr=1e-2)
#: 10 steps an epoch (40 samples, 4 a step on each rank): 7 is mid-epoch, 12 in the next one
STEPS, STOP_AFTER = 12, 7


def run_node(out: Path, world: int = 2) -> list[dict[str, Any]]:
    """Start ``world`` rank processes of one node; what each wrote."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    module = "tests.integrations.stateful_loader_rank"
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", module, str(rank), str(world), str(out)],
            cwd=REPO,
            env=env,
            stderr=subprocess.PIPE,
        )
        for rank in range(world)
    ]
    errors = [p.communicate(timeout=240)[1].decode(errors="replace") for p in processes]
    assert [p.returncode for p in processes] == [0] * world, "\n".join(e[-3000:] for e in errors)
    return [torch.load(out / f"rank-{rank}.pt", weights_only=False) for rank in range(world)]


def train(
    directory: Path, rank: int, world: int, stop_after: int | None = None
) -> tuple[SupervisedLoop, list[list[int]]]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=PLAN.lr)
    # each rank's own order: torchdata's stateful sampler saves its generator's state, which
    # differs per rank, in the loader's position; the checkpoint the ranks share must keep
    # both. The generator is the sampler's: one given to the loader (shuffle=True,
    # generator=g) is also drawn for the loader's base seed, which a resume does not replay,
    # and the epoch after a resume would differ
    dataset = Indexed()
    sampler = RandomSampler(dataset, generator=torch.Generator().manual_seed(10 + rank))
    data = StatefulDataLoader(dataset, batch_size=PLAN.micro_batch, sampler=sampler)
    config = ShimConfig(
        ckpt_dir=str(directory),
        ckpt_every=50,
        world_size=world,
        rank=rank,
        local_rank=rank,
        local_world_size=world,
    )
    loop = SupervisedLoop(
        shim=TrainerShim(config, install_signal_handlers=False),
        plan=PLAN,
        data=data,
        model=model,
        optimizer=optimizer,
    )
    seen: list[list[int]] = []
    for step in loop.steps(STEPS):
        indices: list[int] = []
        for index, features in loop.micro_batches():
            loss = model(features).square().mean()
            loss.backward()
            indices += index.tolist()
        for parameter in model.parameters():  # data parallel: the ranks' mean gradient
            dist.all_reduce(parameter.grad)
            parameter.grad /= world
        optimizer.step()
        optimizer.zero_grad()
        loop.step_done(loss, tokens=len(indices))
        seen.append(indices)
        if step == stop_after:
            break  # every rank leaves the loop here: it saves where it is
    return loop, seen


def main() -> None:
    rank, world, out = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        reference, reference_seen = train(out / "reference", rank, world)
        _, first_seen = train(out / "resumed", rank, world, stop_after=STOP_AFTER)
        resumed, resumed_seen = train(out / "resumed", rank, world)
        restored = resumed.restored.step if resumed.restored is not None else None
        result = {
            "reference_seen": reference_seen,
            "first_seen": first_seen,
            "resumed_seen": resumed_seen,
            "restored": restored,
            # state() gathers the positions: every rank calls it, in the same order
            "reference_state": reference.state(),
            "resumed_state": resumed.state(),
        }
        torch.save(result, out / f"rank-{rank}.pt")
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
