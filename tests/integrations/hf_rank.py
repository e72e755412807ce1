"""One rank of a Hugging Face ``Trainer`` job under ``GoodputTrainerCallback``, data parallel.

``python -m tests.integrations.hf_rank RANK WORLD CKPT OUT [STOP_AT]`` (rendezvous from
MASTER_ADDR and MASTER_PORT when WORLD > 1; :func:`run_ranks` starts them). The ranks are one
node's: they share the checkpoint directory CKPT. With WORLD > 1 the Trainer runs data
parallel itself (accelerate's gloo group on CPU, its sampler sharded per rank), as it would
under ``goodput run``. The batch plan keeps the global batch (``keep_global_batch``), so one
rank accumulates what two ran side by side. Writes the sample indices each optimizer step
trained on, and the LR and accumulation it ran with, to ``OUT/rank-RANK.pt``, with the final
weights and how far the optimizer and LR scheduler stepped. ``INTEG_SKIP_STEPS`` (spelled as
``GOODPUT_SKIP_STEPS``) gives the ranks step windows to skip.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
import transformers

from goodput import schemas
from goodput.integrations.hf_trainer import GoodputTrainerCallback
from goodput.launch.rank_env import parse_step_windows
from goodput.shim import BatchPlan, ShimConfig, TrainerShim, keep_global_batch
from tests.examples.launch import free_port

REPO = Path(__file__).resolve().parents[2]
PLAN = BatchPlan(global_batch=32, micro_batch=16, lr=1e-2)
#: 128 samples: 4 optimizer steps an epoch at either data-parallel size
SAMPLES, MAX_STEPS = 128, 10


class IndexedRegression(torch.nn.Module):
    """A regression that notes which samples each forward pass trained on."""

    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1)
        )
        self.micro_batches: list[list[int]] = []

    def forward(
        self, inputs: torch.Tensor, targets: torch.Tensor, index: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        self.micro_batches.append(index.tolist())
        return {"loss": torch.nn.functional.mse_loss(self.net(inputs), targets)}


class Record(transformers.TrainerCallback):
    """Per optimizer step: the samples of its micro-batches; a stop command after ``stop_at``
    (as the supervisor would send it, before goodput's callback looks at the step; with peers
    the ranks stop after the next step, when the stop vote is read)."""

    def __init__(self, model: IndexedRegression, shim: TrainerShim, stop_at: int | None) -> None:
        self.model, self.shim, self.stop_at = model, shim, stop_at
        self.steps: list[list[int]] = []

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        self.steps.append([i for batch in self.model.micro_batches for i in batch])
        self.model.micro_batches.clear()
        if state.global_step == self.stop_at:
            self.shim._on_command(schemas.Stop(job="j", reason="test"))


def run_ranks(
    ckpt: Path, out: Path, world: int, stop_at: int | None = None, skip: str = ""
) -> list[dict]:
    """Start ``world`` rank processes of one node; what each wrote."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    env["INTEG_SKIP_STEPS"] = skip
    env["HF_HUB_OFFLINE"] = "1"
    argv = [str(ckpt), str(out)] + ([str(stop_at)] if stop_at is not None else [])
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.integrations.hf_rank", str(rank), str(world), *argv],
            cwd=REPO,
            env=env,
            stderr=subprocess.PIPE,
        )
        for rank in range(world)
    ]
    errors = [p.communicate(timeout=300)[1].decode(errors="replace") for p in processes]
    assert [p.returncode for p in processes] == [0] * world, "\n".join(e[-3000:] for e in errors)
    return [torch.load(out / f"rank-{rank}.pt", weights_only=False) for rank in range(world)]


def train(rank: int, world: int, ckpt: Path, stop_at: int | None) -> dict[str, Any]:
    if world > 1:  # the torchrun environment the Trainer (accelerate) reads
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world))
    torch.manual_seed(0)
    inputs = torch.randn(SAMPLES, 4)
    data = [
        {"inputs": x, "targets": x.sum(dim=0, keepdim=True), "index": i}
        for i, x in enumerate(inputs)
    ]
    config = ShimConfig(
        ckpt_dir=str(ckpt),
        ckpt_every=4,
        world_size=world,
        rank=rank,
        local_rank=rank,
        local_world_size=world,
        skip_steps=parse_step_windows(os.environ.get("INTEG_SKIP_STEPS", "")),
    )
    shim = TrainerShim(config, install_signal_handlers=False)
    goodput = GoodputTrainerCallback(shim=shim, plan=PLAN, rescale=[keep_global_batch])
    model = IndexedRegression()
    record = Record(model, shim, stop_at)
    args = transformers.TrainingArguments(
        output_dir=str(ckpt.parent / f"trainer-{rank}"),
        max_steps=MAX_STEPS,
        per_device_train_batch_size=PLAN.micro_batch,
        learning_rate=PLAN.lr,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = transformers.Trainer(
        model=model, args=args, train_dataset=data, callbacks=[record, goodput]
    )
    trainer.train(resume_from_checkpoint=goodput.resume_path(trainer.args))
    restored = goodput.restored
    return {
        "steps": record.steps,
        "restored": None if restored is None else restored.step,
        "accumulation": trainer.args.gradient_accumulation_steps,
        "global_step": trainer.state.global_step,
        "lr": goodput.plan.lr if goodput.plan is not None else None,
        "weights": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "optimizer_steps": {
            int(s["step"]) for s in trainer.optimizer.state_dict()["state"].values()
        },
        "scheduler_steps": trainer.lr_scheduler.state_dict()["last_epoch"],
    }


def main() -> None:
    rank, world, ckpt, out = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
    stop_at = int(sys.argv[5]) if len(sys.argv) > 5 else None
    result = train(rank, world, ckpt, stop_at)
    torch.save(result, Path(out) / f"rank-{rank}.pt")


if __name__ == "__main__":
    main()
