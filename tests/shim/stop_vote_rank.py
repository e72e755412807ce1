"""One rank of a job ending its steps with the step protocol (``end_step``) and a real
``TrainerShim`` over a real gloo group, for tests/shim/test_stop_vote.py.

``python -m tests.shim.stop_vote_rank MODE RANK WORLD CKPT_DIR STOP_AT PORT`` (the group's
store on 127.0.0.1:PORT) prints one JSON object: the step the loop stopped after, the newest
step its engine made durable (it saves only when stopping or at the last step), and the
ballots its vote launched.

* ``stop``: a ``Stop`` command reaches this rank before the end of step ``STOP_AT`` (0:
  never), handed to the shim's command handler as its bus link would;
* ``ahead``: rank 0 ends each step before rank 1 has even begun ending it — rank 1 waits in
  the group's store for rank 0's word that step k ended before it ends step k. A vote that
  waited in the step for every rank's ballot would never return on rank 0.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

from goodput import schemas
from goodput.shim.step_protocol import end_step
from goodput.shim.stop_vote import StopVote
from goodput.shim.trainer import ShimConfig, TrainerShim

STEPS = 8  # below the schedule's first agreement step (10): the stop vote is the only collective
#: how long rank 1 waits for rank 0's word: far longer than a step here, even on a busy machine
WORD_TIMEOUT = timedelta(seconds=60)


def main() -> None:
    mode, ckpt_dir = sys.argv[1], sys.argv[4]
    rank, world, stop_at, port = (int(arg) for arg in (*sys.argv[2:4], *sys.argv[5:7]))
    store = dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0, timeout=WORD_TIMEOUT)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    config = ShimConfig(job="j", rank=rank, world_size=world, ckpt_dir=ckpt_dir, ckpt_every=0)
    shim = TrainerShim(config, install_signal_handlers=False)
    state = {"weights": torch.zeros(4)}
    vote = StopVote()
    step = stopped_after = 0
    for step in range(1, STEPS + 1):
        state["weights"] += 1
        if mode == "stop" and step == stop_at:
            shim._on_command(schemas.Stop(job="j", reason="test"))
        if mode == "ahead" and rank == 1:
            store.wait([f"ended-{step}"])
        stop = end_step(
            shim,
            step,
            step_time_s=0.01,
            tokens=0,
            loss=0.0,
            state=lambda: state,
            vote=vote,
            final=step == STEPS,
        )
        if mode == "ahead" and rank == 0:
            store.set(f"ended-{step}", "1")
        if stop:
            stopped_after = step
            break
    shim.finish(state, step)
    report = {
        "stopped_after": stopped_after,
        "saved": shim.engine.latest_complete_step(),
        "ballots": vote.launched,
    }
    print(json.dumps(report), flush=True)
    dist.barrier()  # leave together: a gloo peer exiting early aborts the other
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
