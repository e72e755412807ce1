"""Kill -9 the saving process at random moments: restore always gets the newest committed one."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from pathlib import Path

import pytest

from goodput.checkpoint.engine import CheckpointEngine, read_manifest, verify_files
from goodput.checkpoint.engine.events import CheckpointSaved
from goodput.checkpoint.format import step_dirs

from .helpers import assert_bit_exact, make_state

TRIALS = 25


def _trial_state(step: int) -> dict:
    return make_state(step, scale=48)  # about 5 MB: several data files, tens of ms to persist


def _save_until_killed(
    root: str, first_step: int, persisting: multiprocessing.synchronize.Event
) -> None:
    """Save forever; ``persisting`` is set once a second save is being persisted."""

    def listener(event: object) -> None:
        if isinstance(event, CheckpointSaved) and event.step > first_step:
            persisting.set()

    engine = CheckpointEngine(
        root, keep_last=3, writer_threads=2, min_file_bytes=256 << 10, listener=listener
    )
    step = first_step
    while True:
        engine.save(_trial_state(step), step).wait()
        step += 1


@pytest.mark.slow
def test_kill_minus_nine_during_persist_never_yields_a_partial_checkpoint(tmp_path: Path) -> None:
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["torch", "goodput.checkpoint.engine", __name__])
    chooser = random.Random(20261121)
    root = tmp_path / "ckpt"
    restored_steps = []
    killed_mid_write = 0
    for _ in range(TRIALS):
        committed = step_dirs(root)
        first_step = committed[0][0] + 1 if committed else 1
        persisting = context.Event()
        saver = context.Process(target=_save_until_killed, args=(str(root), first_step, persisting))
        saver.start()
        if chooser.random() < 0.9:  # mostly somewhere inside a persist, else anywhere
            assert persisting.wait(60), "the saver never got to its second save"
            time.sleep(chooser.uniform(0.0, 0.03))
        else:
            time.sleep(chooser.uniform(0.0, 0.2))
        os.kill(saver.pid, signal.SIGKILL)
        saver.join()

        names = os.listdir(root) if root.exists() else []
        killed_mid_write += any(name.startswith(".tmp-") for name in names)
        visible = step_dirs(root)
        for _, path in visible:
            assert verify_files(path) == [], f"{path.name} is visible but not intact"
        if not visible:
            continue
        newest = visible[0][0]
        assert read_manifest(visible[0][1]).step == newest
        with CheckpointEngine(root) as engine:
            step, state = engine.restore()
        assert step == newest
        assert_bit_exact(_trial_state(step), state)
        restored_steps.append(step)
    assert len(restored_steps) >= TRIALS // 2, "most trials must have something to restore"
    print(f"kills mid-write: {killed_mid_write}/{TRIALS}")
    assert killed_mid_write > 0, "no kill landed while a checkpoint was being written"
