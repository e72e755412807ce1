"""The example job under goodput supervision: the trainer, driven by the shim's own loop.

    goodput run --nodes 2 --procs-per-node 1 --spares 1 -- \\
        python -m goodput.examples.gpt.supervised --steps 300 --ckpt-every 25

Checkpoints go where the actuator says (GOODPUT_CKPT_DIR), asynchronously through the
checkpoint engine; heartbeats, steps and checkpoint events go to the bus; SIGTERM or a stop
command saves and exits with status 143 so the supervisor can tell a departure from a finish.
The trainer is built by ``goodput.shim.run_job`` before it joins its process group, so a
failed step restarts in process and the job can keep pre-warmed standby ranks
(``StartJob.standbys``): a standby builds its trainer ahead of time and waits to be a rank.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import Any

import torch

from goodput.examples.gpt import train
from goodput.examples.gpt.loop import LoopResult
from goodput.examples.gpt.training import Trainer
from goodput.launch.rank_env import RankEnv
from goodput.shim import run_job
from goodput.shim.rescale import BUILTIN_RULES
from goodput.warm_path import WarmPathError, WarmPathTimeouts


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # what the command line sets wins over the environment; the rest the shim reads from the
    # environment once it is a rank (a standby learns its volume only from its assignment)
    options: dict[str, Any] = {}
    if "--ckpt-dir" not in argv:
        argv += ["--ckpt-dir", "checkpoints"]
    else:
        options["ckpt_dir"] = argv[argv.index("--ckpt-dir") + 1]
    if "--ckpt-every" in argv:
        options["ckpt_every"] = int(argv[argv.index("--ckpt-every") + 1])
    args = train.parse_args(argv)
    try:
        timeouts = WarmPathTimeouts(group_s=args.dist_timeout_s)
    except WarmPathError as exc:
        print(f"--dist-timeout-s: {exc}", file=sys.stderr)
        return 2
    env = RankEnv.from_env()
    who = "standby" if env.standby else f"rank{env.rank}"
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {who} %(name)s: %(message)s")
    # Ranks share few cores: one thread each avoids oversubscription (and keeps math repeatable).
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    config = train.train_config(args)
    built: list[Trainer] = []

    def build_state() -> Trainer:
        built.append(Trainer(config))
        return built[-1]

    try:
        run = run_job(
            build_state,
            args.steps,
            rescale=BUILTIN_RULES[args.rescale](),
            stop_at=args.exit_at_step,
            timeouts=timeouts,
            **options,
        )
        if args.result is not None and run.shim.config.rank == 0:
            outcome = run.outcome
            loop = LoopResult(
                first_step=outcome.first_step,
                step=outcome.step,
                stopped=outcome.stopped,
                losses=outcome.losses,
                step_time_s=outcome.step_time_s,
                skipped=outcome.skipped,
            )
            train.write_json(train.result_record(built[0], loop), args.result)
    finally:
        # the DDP wrapper holds the gloo group: left to interpreter exit, the process can hang
        for trainer in built:
            trainer.close()
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    return run.shim.exit_code


if __name__ == "__main__":
    sys.exit(main())
