"""goodput for a plain training loop (torchtitan-style scripts): two lines around the loop.

    loop = SupervisedLoop(model=model, optimizer=optimizer, scheduler=scheduler, plan=plan)
    for step in loop.steps(total_steps):     # restores first; stops on SIGTERM / a stop command
        loss = train_step(...)
        loop.step_done(loss, tokens)          # heartbeat, step event, checkpoint when due
    sys.exit(loop.exit_code)                  # 143 after SIGTERM: the supervisor tells them apart

Every object given by name is saved with its ``state_dict()`` and restored with
``load_state_dict()`` (model, optimizer, LR scheduler, a stateful data loader...), together
with the torch RNG states, so a killed job resumes bit-identically. Rescale callbacks see the
state under the same names: the built-in ``scale_lr`` finds ``optimizer`` and ``scheduler``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any, Protocol

import torch

from goodput.shim.agree import any_rank
from goodput.shim.rescale import BatchPlan, RescaleCallback
from goodput.shim.restore_result import RestoreResult
from goodput.shim.trainer import TrainerShim

#: the key of the RNG states in the saved state (a component may not use it)
RNG_KEY = "rng"


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any], /) -> Any: ...


def rng_states() -> dict[str, torch.Tensor]:
    states = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for index, state in enumerate(torch.cuda.get_rng_state_all()):
            states[f"cuda{index}"] = state
    return states


def set_rng_states(states: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(states["cpu"])
    cuda = [states[f"cuda{i}"] for i in range(len(states) - 1) if f"cuda{i}" in states]
    if cuda:
        torch.cuda.set_rng_state_all(cuda)


class SupervisedLoop:
    """Restore, step accounting, checkpoints and stop requests for a hand-written loop."""

    def __init__(
        self,
        *,
        shim: TrainerShim | None = None,
        plan: BatchPlan | None = None,
        rescale: tuple[RescaleCallback, ...] | list[RescaleCallback] = (),
        **components: Stateful,
    ) -> None:
        if RNG_KEY in components:
            raise ValueError(f"{RNG_KEY!r} is where the RNG states are saved: name it otherwise")
        self.shim = shim if shim is not None else TrainerShim.from_env()
        self.components = components
        self.plan = plan
        for callback in rescale:
            self.shim.on_rescale(callback)
        #: what ``steps`` restored (None: a fresh start)
        self.restored: RestoreResult | None = None
        self.step = 0
        self._loss: float | None = None
        self._tokens = 0
        self._started = 0.0

    @property
    def exit_code(self) -> int:
        return self.shim.exit_code

    def state(self) -> dict[str, Any]:
        """What a checkpoint holds: each component's state dict and the RNG states."""
        state = {name: component.state_dict() for name, component in self.components.items()}
        state[RNG_KEY] = rng_states()
        return state

    def restore(self) -> RestoreResult | None:
        """Load the newest checkpoint into the components (rescaled if the DP size changed)."""
        result = self.shim.restore(self.state(), plan=self.plan)
        self.restored = result
        if result is None:
            return None
        for name, component in self.components.items():
            component.load_state_dict(result.state[name])
        set_rng_states(result.state[RNG_KEY])
        self.plan = result.plan
        self.step = result.step
        return result

    def steps(self, total_steps: int) -> Iterator[int]:
        """Restore, then yield each step number to run (from 1); call :meth:`step_done` in
        the body. Ends at ``total_steps`` or on a stop request, after the final save."""
        self.restore()
        try:
            while self.step < total_steps:
                self._loss = None
                self._started = time.perf_counter()
                yield self.step + 1
                if self._loss is None:
                    raise RuntimeError("call loop.step_done(loss, tokens) in every step")
                self._complete_step()
                # every rank saves and stops at the same step, or one waits for the others
                checkpoint, stop = any_rank(
                    self.shim.should_checkpoint(self.step), self.shim.should_stop()
                )
                if stop:
                    break
                if checkpoint and self.step < total_steps:
                    self.shim.save(self.state(), self.step)
        except GeneratorExit:  # the script left the loop: save where it is
            if self._loss is not None:  # inside a step it reported: that step is done
                self._complete_step()
            self.shim.finish(self.state(), self.step)
            raise
        self.shim.finish(self.state(), self.step)

    def _complete_step(self) -> None:
        assert self._loss is not None
        self.step += 1
        self.shim.step_done(
            self.step, time.perf_counter() - self._started, self._tokens, self._loss
        )
        self._loss = None

    def step_done(self, loss: float | torch.Tensor, tokens: int = 0) -> None:
        """The step's loss (a float or a 0-d tensor) and tokens, for the job's step events."""
        self._loss = float(loss.detach()) if isinstance(loss, torch.Tensor) else float(loss)
        self._tokens = tokens
