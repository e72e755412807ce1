"""Runs a training script (``argv[1]``) as a rank, with two test-only additions to the shim:

- ``INTEG_KILL_AT_STEP=N``: on attempt 1, once step N's checkpoint work is durable, rank 0
  SIGKILLs itself (a crash the supervisor must recover from; its peers survive it);
- ``INTEG_RESULT=PATH``: rank 0 writes the state it finishes with (``torch.save``), and the
  step each attempt restored (``PATH.restored``), for comparison with an uninterrupted run.

The script itself is unchanged: the README's snippets run through this as they are shown.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
from pathlib import Path
from typing import Any

import torch

from goodput.shim.trainer import TrainerShim

_step_done = TrainerShim.step_done
_finish = TrainerShim.finish
_restore = TrainerShim.restore


def step_done(self: TrainerShim, step: int, *args: Any, **kwargs: Any) -> None:
    _step_done(self, step, *args, **kwargs)
    kill_at = os.environ.get("INTEG_KILL_AT_STEP")
    if kill_at and self.config.attempt == 1 and self.config.rank == 0 and step == int(kill_at):
        self.engine.wait_until_idle()
        os.kill(os.getpid(), signal.SIGKILL)


def finish(self: TrainerShim, state: dict[str, Any], step: int) -> None:
    _finish(self, state, step)
    result = os.environ.get("INTEG_RESULT")
    if result and self.config.rank == 0:
        torch.save({"step": step, "state": state}, result)


def restore(self: TrainerShim, *args: Any, **kwargs: Any) -> Any:
    restored = _restore(self, *args, **kwargs)
    result = os.environ.get("INTEG_RESULT")
    if result and self.config.rank == 0:
        with Path(f"{result}.restored").open("a") as log:
            log.write(f"{self.config.attempt} {restored.step if restored else 0}\n")
    return restored


TrainerShim.step_done = step_done  # type: ignore[method-assign]
TrainerShim.finish = finish  # type: ignore[method-assign]
TrainerShim.restore = restore  # type: ignore[method-assign]

if __name__ == "__main__":
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    runpy.run_path(script, run_name="__main__")
