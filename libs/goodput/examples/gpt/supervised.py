"""The example job under goodput supervision: the same loop, with the trainer shim as hooks.

    goodput run --nodes 2 --procs-per-node 1 --spares 1 -- \\
        python -m goodput.examples.gpt.supervised --steps 300 --ckpt-every 25

Checkpoints go where the actuator says (GOODPUT_CKPT_DIR), asynchronously through the
checkpoint engine; heartbeats, steps and checkpoint events go to the bus; SIGTERM or a stop
command saves and exits with status 143 so the supervisor can tell a departure from a finish.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from goodput.examples.gpt import train
from goodput.examples.gpt.hooks import TrainingHooks
from goodput.examples.gpt.loop import LoopResult
from goodput.examples.gpt.training import Trainer
from goodput.rank_env import RankEnv
from goodput.shim import TrainerShim


def shim_loop(
    trainer: Trainer,
    hooks: TrainingHooks,
    steps: int,
    stop_at: int | None,
    args: argparse.Namespace,
) -> LoopResult:
    """The shim's own loop: a failed step is unwound and resumed in this process when the
    supervisor restarts the group in process (the killed rank alone is started again)."""
    assert isinstance(hooks, TrainerShim)
    outcome = hooks.run(trainer, steps, stop_at=stop_at, group_timeout_s=args.dist_timeout_s)
    return LoopResult(
        first_step=outcome.first_step,
        step=outcome.step,
        stopped=outcome.stopped,
        losses=outcome.losses,
        step_time_s=outcome.step_time_s,
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rank_env = RankEnv.from_env()
    if "--ckpt-dir" not in argv:
        argv += ["--ckpt-dir", rank_env.ckpt_dir or "checkpoints"]
    if "--ckpt-every" not in argv and rank_env.ckpt_every is not None:
        argv += ["--ckpt-every", str(rank_env.ckpt_every)]
    shims: list[TrainerShim] = []

    def shim_hooks(args: argparse.Namespace, info: train.DistInfo) -> TrainerShim:
        shim = TrainerShim.from_env(ckpt_dir=str(args.ckpt_dir), ckpt_every=args.ckpt_every)
        shims.append(shim)
        return shim

    status = train.main(argv, hooks_factory=shim_hooks, loop=shim_loop)
    return status or (shims[0].exit_code if shims else 0)


if __name__ == "__main__":
    sys.exit(main())
