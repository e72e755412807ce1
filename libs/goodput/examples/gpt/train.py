"""Entry point of the example job, launched like torchrun (RANK, WORLD_SIZE, MASTER_ADDR/PORT).

    python -m goodput.examples.gpt.train --steps 300 --ckpt-dir /tmp/ckpt --ckpt-every 50 --seed 0

Resumes from the newest checkpoint in --ckpt-dir, at any world size that divides the batch.
Exits 0 both when training completed and when it stopped on request after saving; the
--result JSON tells the two apart ("completed").
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from goodput.examples.gpt.hooks import TrainingHooks
from goodput.examples.gpt.local_hooks import LocalFileHooks
from goodput.examples.gpt.loop import LoopResult, run_training
from goodput.examples.gpt.model import ModelConfig
from goodput.examples.gpt.training import TrainConfig, Trainer, params_sha256
from goodput.launch.rank_env import RankEnv, parse_step_windows
from goodput.shim.rescale import BUILTIN_RULES, BatchPlan


@dataclass(frozen=True)
class DistInfo:
    rank: int
    local_rank: int
    world_size: int

    @classmethod
    def from_env(cls) -> DistInfo:
        env = RankEnv.from_env()
        return cls(rank=env.rank, local_rank=env.local_rank, world_size=env.world_size)


HooksFactory = Callable[[argparse.Namespace, DistInfo], TrainingHooks]
#: runs the training: the hooks' loop (``run_training``), or a supervisor's own (shim.run)
TrainingLoop = Callable[[Trainer, TrainingHooks, int, "int | None", argparse.Namespace], LoopResult]


def hooks_loop(
    trainer: Trainer,
    hooks: TrainingHooks,
    steps: int,
    stop_at: int | None,
    args: argparse.Namespace,
) -> LoopResult:
    return run_training(trainer, hooks, steps, stop_at=stop_at)


def local_file_hooks(args: argparse.Namespace, info: DistInfo) -> TrainingHooks:
    return LocalFileHooks(
        args.ckpt_dir,
        args.ckpt_every,
        rank=info.rank,
        world_size=info.world_size,
        keep=args.keep,
        log_every=args.log_every,
        skip_steps=args.skip_steps,
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    defaults = TrainConfig()
    model = ModelConfig()
    parser = argparse.ArgumentParser(prog="python -m goodput.examples.gpt.train")
    parser.add_argument(
        "--steps", type=int, default=defaults.total_steps, help="total steps (LR schedule length)"
    )
    parser.add_argument("--ckpt-dir", type=Path, required=True)
    parser.add_argument(
        "--ckpt-every", type=int, default=50, help="steps between checkpoints; 0: only at the end"
    )
    parser.add_argument("--keep", type=int, default=3, help="checkpoints kept on disk")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--global-batch", type=int, default=defaults.plan.global_batch)
    parser.add_argument("--micro-batch", type=int, default=defaults.plan.micro_batch)
    parser.add_argument("--lr", type=float, default=defaults.plan.lr)
    parser.add_argument("--warmup-steps", type=int, default=defaults.warmup_steps)
    parser.add_argument("--n-layer", type=int, default=model.n_layer)
    parser.add_argument("--n-head", type=int, default=model.n_head)
    parser.add_argument("--d-model", type=int, default=model.d_model)
    parser.add_argument("--seq-len", type=int, default=model.seq_len)
    parser.add_argument("--dropout", type=float, default=model.dropout)
    parser.add_argument(
        "--rescale",
        choices=sorted(BUILTIN_RULES),
        default="keep-global-batch",
        help="what changes when resumed at another data-parallel size (goodput.shim.rescale): "
        "the per-rank accumulation (keep-global-batch) or the global batch and LR",
    )
    parser.add_argument(
        "--exit-at-step", type=int, help="save and exit after this step (as on SIGTERM)"
    )
    parser.add_argument("--result", type=Path, help="JSON summary written by rank 0 at the end")
    parser.add_argument(
        "--skip-steps",
        type=parse_step_windows,
        default=(),
        metavar="FIRST-LAST[,...]",
        help="train on no batch of these steps, as a loss spike's rollback skips them under "
        "goodput (GOODPUT_SKIP_STEPS): the run it would have been",
    )
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--dist-timeout-s", type=float, default=300.0)
    return parser.parse_args(argv)


def train_config(args: argparse.Namespace) -> TrainConfig:
    return TrainConfig(
        seed=args.seed,
        total_steps=args.steps,
        plan=BatchPlan(global_batch=args.global_batch, micro_batch=args.micro_batch, lr=args.lr),
        model=ModelConfig(
            seq_len=args.seq_len,
            n_layer=args.n_layer,
            n_head=args.n_head,
            d_model=args.d_model,
            dropout=args.dropout,
        ),
        warmup_steps=args.warmup_steps,
    )


def result_record(trainer: Trainer, outcome: LoopResult) -> dict[str, Any]:
    return {
        "steps": trainer.step,
        "first_step": outcome.first_step,
        "completed": not outcome.stopped,
        "world_size": trainer.world_size,
        "global_batch": trainer.plan.global_batch,
        "accumulation_steps": trainer.plan.accumulation_steps(trainer.world_size),
        "lr": trainer.plan.lr,
        "params_sha256": params_sha256(trainer.model),
        "final_loss": outcome.losses[-1][1] if outcome.losses else None,
        "mean_step_time_s": outcome.step_time_s / len(outcome.losses) if outcome.losses else None,
        "losses": outcome.losses,
        # the steps whose batches were not trained on (a loss spike's rollback): the run
        # differs from an uninterrupted one by exactly these
        "skipped_steps": outcome.skipped,
    }


def write_json(record: dict[str, Any], path: Path) -> None:
    temp = path.with_name(f".{path.name}.tmp")
    temp.write_text(json.dumps(record, indent=1))
    temp.replace(path)


def main(
    argv: Sequence[str] | None = None,
    hooks_factory: HooksFactory = local_file_hooks,
    loop: TrainingLoop = hooks_loop,
) -> int:
    args = parse_args(argv)
    info = DistInfo.from_env()
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s rank{info.rank} %(name)s: %(message)s"
    )
    # Ranks share few cores: one thread each avoids oversubscription (and keeps math repeatable).
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    if info.world_size > 1:
        dist.init_process_group(
            "gloo",
            rank=info.rank,
            world_size=info.world_size,
            timeout=timedelta(seconds=args.dist_timeout_s),
        )
    trainer = None
    try:
        trainer = Trainer(train_config(args), info.rank, info.world_size)
        hooks = hooks_factory(args, info)
        for callback in BUILTIN_RULES[args.rescale]():
            hooks.on_rescale(callback)
        outcome = loop(trainer, hooks, args.steps, args.exit_at_step, args)
        if args.result is not None and info.rank == 0:
            write_json(result_record(trainer, outcome), args.result)
    finally:
        if trainer is not None:
            trainer.close()
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
