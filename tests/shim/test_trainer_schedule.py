"""The shim's checkpoint decisions in real rank processes agreeing over a gloo process group.

Each rank gets the commands at a different step, handed to the shim's command handler as its
bus link would (no bus here: the delivery step is what the test controls)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.examples.launch import free_port

RANK_SCRIPT = """\
import json, sys
import torch.distributed as dist
from goodput import schemas
from goodput.shim.trainer import ShimConfig, TrainerShim

rank, world, ckpt_dir, plan = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
if world > 1:
    dist.init_process_group("gloo", rank=rank, world_size=world)
config = ShimConfig(job="j", rank=rank, world_size=world, ckpt_dir=ckpt_dir, ckpt_every=10)
shim = TrainerShim(config, install_signal_handlers=False)
due = []
for step in range(1, 41):
    for kind, value in plan.get(str(step), []):
        if kind == "interval":
            shim._on_command(schemas.SetCheckpointInterval(job="j", ts=1000, every_steps=value))
        else:
            shim._on_command(schemas.CheckpointNow(job="j"))
    if shim.should_checkpoint(step):
        due.append(step)
print(json.dumps(due), flush=True)
if world > 1:
    # leave together: a rank exiting while its peer's gloo threads still talk to it aborts
    dist.barrier()
    dist.destroy_process_group()
"""


def run_ranks(tmp_path: Path, plans: list[dict[str, list]]) -> list[list[int]]:
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                RANK_SCRIPT,
                str(rank),
                str(len(plans)),
                str(tmp_path / f"ckpt{rank}"),
                json.dumps(plan),
            ],
            env=env,
            stdout=subprocess.PIPE,
        )
        for rank, plan in enumerate(plans)
    ]
    outputs = [p.communicate(timeout=240)[0] for p in processes]
    assert [p.returncode for p in processes] == [0] * len(plans)
    return [json.loads(out.decode().strip().splitlines()[-1]) for out in outputs]


def test_ranks_told_at_different_steps_checkpoint_the_same_steps(tmp_path: Path) -> None:
    # rank 0 hears "every 7" at step 3, rank 1 at step 14; only rank 1 is asked for a
    # checkpoint now, at step 23: the interval holds from the vote at 20, the request at 30
    plans = [{"3": [["interval", 7]]}, {"14": [["interval", 7]], "23": [["now", 0]]}]
    assert run_ranks(tmp_path, plans) == [[10, 20, 27, 30, 34]] * 2


def test_a_rank_alone_obeys_at_once(tmp_path: Path) -> None:
    [due] = run_ranks(tmp_path, [{"3": [["interval", 7]], "23": [["now", 0]]}])
    assert due == [10, 17, 23, 24, 31, 38]  # every 7 counted from step 3; 23 on request
