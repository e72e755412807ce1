"""The pipelined stop vote (``goodput.shim.stop_vote``) in real rank processes over gloo.

What the supervisor relies on: a stop that reaches the ranks at different steps is honoured
by every rank after the same step (one step after the first rank had it), which every rank
saves. What the step relies on: ending a step never waits for the peers' ballots of that
step — rank 0 ends each step before rank 1 has begun ending it (``ahead``), which a blocking
vote could not do. On a GPU, tests/gpu/test_gpu_stop_vote.py shows the CUDA ballot makes no
host sync.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from goodput.shim.stop_vote import StopVote
from tests.examples.launch import free_port

REPO = Path(__file__).resolve().parents[2]
STEPS = 8


def run_ranks(tmp_path: Path, mode: str, stop_at: list[int]) -> list[dict[str, Any]]:
    port, world = free_port(), len(stop_at)
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.shim.stop_vote_rank",
                mode,
                str(rank),
                str(world),
                str(tmp_path / f"ckpt{rank}"),
                str(at),
                str(port),
            ],
            cwd=REPO,
            env=dict(os.environ),
            stdout=subprocess.PIPE,
        )
        for rank, at in enumerate(stop_at)
    ]
    outputs = [p.communicate(timeout=240)[0] for p in processes]
    assert [p.returncode for p in processes] == [0] * world
    return [json.loads(out.decode().strip().splitlines()[-1]) for out in outputs]


def test_a_stop_reaching_ranks_at_different_steps_ends_all_after_the_same_step(
    tmp_path: Path,
) -> None:
    # rank 1 is told at step 3, rank 2 at step 5, rank 0 never: rank 1's ballot of step 3 is
    # read by every rank at step 4, which every rank saves and stops after
    outcomes = run_ranks(tmp_path, "stop", [0, 3, 5])
    assert [o["stopped_after"] for o in outcomes] == [4, 4, 4]
    assert [o["saved"] for o in outcomes] == [4, 4, 4]
    assert [o["ballots"] for o in outcomes] == [3, 3, 3]  # step 4 read the stop: cast none


def test_without_a_stop_every_rank_runs_to_the_end(tmp_path: Path) -> None:
    outcomes = run_ranks(tmp_path, "stop", [0, 0])
    assert [(o["stopped_after"], o["saved"]) for o in outcomes] == [(0, STEPS)] * 2
    # the last step casts no ballot: nobody would read it
    assert [o["ballots"] for o in outcomes] == [STEPS - 1] * 2


def test_a_step_ends_without_waiting_for_the_peers_ballots(tmp_path: Path) -> None:
    outcomes = run_ranks(tmp_path, "ahead", [0, 0])
    assert [(o["stopped_after"], o["saved"]) for o in outcomes] == [(0, STEPS)] * 2


def test_a_rank_alone_stops_at_once() -> None:
    vote = StopVote()
    assert [vote.cast(flag) for flag in (False, False, True)] == [False, False, True]
    assert vote.launched == 0  # no group: nothing to launch
