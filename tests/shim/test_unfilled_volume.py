"""The ranks restore one step together, and never go back to step 0 while a checkpoint exists.

Two real rank processes on gloo, one node each, save step 5 on their own volumes. Node 1's
volume is then lost (the spare that replaces it starts empty) and the ranks start again: every
rank refuses with one clear error instead of agreeing on "no checkpoint" and training from
scratch, which is what they did when a spare's volume was not refilled before the launch.
A rank whose newest checkpoint is corrupt makes every rank restore the older one (one rank
used to leave the agreement a round before the other, which then waited in it for ever); a
rank that can restore none makes every rank refuse."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from goodput.checkpoint.engine import CheckpointEngine
from goodput.checkpoint.format import step_dir

pytestmark = pytest.mark.timeout(300)

RANK = """
import os, sys
from datetime import timedelta
import torch, torch.distributed as dist
from goodput.shim import ShimConfig, TrainerShim, UnfilledVolumeError, UnrestorableCheckpointError

rank, port, volume = int(sys.argv[1]), sys.argv[2], sys.argv[3]
dist.init_process_group("gloo", rank=rank, world_size=2, init_method=f"tcp://127.0.0.1:{port}",
                        timeout=timedelta(seconds=120))
config = ShimConfig(ckpt_dir=volume, world_size=2, rank=rank, local_rank=0, local_world_size=1)
shim = TrainerShim(config, install_signal_handlers=False)
code = 0
try:
    restored = shim.restore({"w": torch.zeros(4)})
    print("restored:", None if restored is None else restored.step, flush=True)
    if restored is not None:
        print("w:", restored.state["w"].tolist(), flush=True)
    shim.finish({"w": torch.arange(4.0) + rank}, 5 if restored is None else restored.step)
except (UnfilledVolumeError, UnrestorableCheckpointError) as exc:
    print("refused:", exc, flush=True)
    shim.engine.close()
    code = 3
finally:
    # as a training script should: a gloo group left to the interpreter's finalization can
    # abort the rank ("terminate called without an active exception", CI of stop 30: -6)
    dist.destroy_process_group()
sys.exit(code)
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start_ranks(volumes: list[Path]) -> list[tuple[int, str]]:
    port = str(_free_port())
    ranks = [
        subprocess.Popen(
            [sys.executable, "-c", RANK, str(rank), port, str(volume)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank, volume in enumerate(volumes)
    ]
    outputs = [rank.communicate(timeout=240)[0] for rank in ranks]
    return [(rank.returncode, output) for rank, output in zip(ranks, outputs, strict=True)]


def test_ranks_refuse_to_start_over_when_one_volume_is_empty(tmp_path: Path) -> None:
    volumes = [tmp_path / "node-0", tmp_path / "node-1"]
    first = _start_ranks(volumes)
    assert all(code == 0 and "restored: None" in out for code, out in first), first
    again = _start_ranks(volumes)  # both volumes intact: both resume at step 5
    assert all(code == 0 and "restored: 5" in out for code, out in again), again

    shutil.rmtree(volumes[1])  # node 1 is replaced by a spare with an empty volume
    refused = _start_ranks(volumes)
    assert [code for code, _ in refused] == [3, 3], refused
    assert "rank 0 holds step 5" in refused[0][1] and "some ranks hold none" in refused[0][1]
    assert "rank 1 holds no checkpoint" in refused[1][1]
    assert "Traceback" not in refused[0][1] + refused[1][1]


def _save_steps(volumes: list[Path], steps: list[int]) -> None:
    """Each volume holds ``steps``, rank r's ``w`` of step s being ``s + r`` throughout."""
    for rank, volume in enumerate(volumes):
        with CheckpointEngine(volume, keep_last=len(steps)) as engine:
            for step in steps:
                assert engine.save({"w": torch.full((4,), float(step + rank))}, step).wait().ok


def _corrupt(volume: Path, step: int) -> None:
    """Flip one byte of each data file of ``step`` (sizes and manifest intact: the volume
    still lists it as its newest complete step; only reading it finds out)."""
    for data in step_dir(volume, step).glob("data-*"):
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        data.write_bytes(bytes(raw))


def test_a_rank_whose_newest_is_corrupt_takes_every_rank_to_the_older_step(
    tmp_path: Path,
) -> None:
    volumes = [tmp_path / "node-0", tmp_path / "node-1"]
    _save_steps(volumes, [5, 10])
    _corrupt(volumes[1], 10)  # rank 0 loads step 10, rank 1 falls back to step 5 on its own
    outcomes = _start_ranks(volumes)
    assert [code for code, _ in outcomes] == [0, 0], outcomes
    for rank, (_, out) in enumerate(outcomes):
        assert "restored: 5" in out and f"w: {[5.0 + rank] * 4}" in out, out


def test_a_rank_that_can_restore_nothing_makes_every_rank_refuse(tmp_path: Path) -> None:
    volumes = [tmp_path / "node-0", tmp_path / "node-1"]
    _save_steps(volumes, [5, 10])
    for step in (5, 10):
        _corrupt(volumes[1], step)
    refused = _start_ranks(volumes)
    assert [code for code, _ in refused] == [3, 3], refused
    assert "rank 0: a rank could restore no intact checkpoint at or before step 10" in refused[0][1]
    assert "rank 1: no intact checkpoint under" in refused[1][1]
    assert "step 10: " in refused[1][1] and "step 5: " in refused[1][1]
    for _, out in refused:
        assert "refusing to start over from step 0" in out and "Traceback" not in out
