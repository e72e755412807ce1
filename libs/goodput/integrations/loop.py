"""goodput for a plain training loop (torchtitan-style scripts): two lines around the loop.

    loop = SupervisedLoop(model=model, optimizer=optimizer, scheduler=scheduler, plan=plan)
    for step in loop.steps(total_steps):     # restores first; stops on SIGTERM / a stop command
        loss = train_step(...)
        loop.step_done(loss, tokens, grad_norm)  # heartbeat, step event, numerics, checkpoint
    sys.exit(loop.exit_code)                  # 143 after SIGTERM: the supervisor tells them apart

Every object given by name is saved with its ``state_dict()`` and restored with
``load_state_dict()`` (model, optimizer, LR scheduler, a stateful data loader...), together
with the torch RNG states, so a killed job resumes bit-identically. Rescale callbacks see the
state under the same names: the built-in ``scale_lr`` finds ``optimizer`` and ``scheduler``.

``overlap_saves=True`` makes each save return once its copy into host memory is launched:
the copy runs during the next forward/backward and the optimizer step waits for it (only
where the forward changes no saved buffer: not with batch norm's running statistics).

Given its data loader (``data=``), the loop also saves where the data stream stands
(:mod:`goodput.shim.data_position`) and hands out each step's micro-batches
(:meth:`SupervisedLoop.micro_batches`: as many as the batch plan asks at this data-parallel
size), so a resume goes on with the next unseen batch, mid-epoch, at any data-parallel size.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

import torch

from goodput.shim.data_position import LoaderPosition
from goodput.shim.numerics import replicated
from goodput.shim.rescale import BatchPlan, RescaleCallback
from goodput.shim.restore_result import RestoreResult
from goodput.shim.step_protocol import end_step
from goodput.shim.stop_vote import StopVote
from goodput.shim.trainer import TrainerShim

log = logging.getLogger(__name__)

#: the key of the RNG states in the saved state (a component may not use it)
RNG_KEY = "rng"
#: the key of the data loader's position in the saved state (a component may not use it)
DATA_KEY = "data"


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
        data: Iterable[Any] | None = None,
        overlap_saves: bool = False,
        **components: Stateful,
    ) -> None:
        for reserved in (RNG_KEY, DATA_KEY):
            if reserved in components:
                raise ValueError(f"{reserved!r} is reserved by the loop: name it otherwise")
        self.shim = shim if shim is not None else TrainerShim.from_env()
        if overlap_saves:
            self._guard_optimizers(components)
        self.components = components
        self.plan = plan
        self.data = LoaderPosition(data) if data is not None else None
        self._batches: Iterator[Any] | None = None
        for callback in rescale:
            self.shim.on_rescale(callback)
        #: what ``steps`` restored (None: a fresh start)
        self.restored: RestoreResult | None = None
        self.step = 0
        self._loss: float | None = None
        self._tokens = 0
        self._started = 0.0
        self._vote = StopVote()
        #: the steps skipped by this process (``_skips_next``)
        self.skipped: list[int] = []
        self._told_no_skip = False

    @property
    def exit_code(self) -> int:
        return self.shim.exit_code

    def _guard_optimizers(self, components: dict[str, Stateful]) -> None:
        """Saves overlap the next forward/backward; each optimizer step waits for the copy
        (``TrainerShim.guard``). Only for models whose forward changes no saved buffer."""
        optimizers = [c for c in components.values() if isinstance(c, torch.optim.Optimizer)]
        if not optimizers:
            raise ValueError("overlap_saves=True needs the optimizer among the components")
        for optimizer in optimizers:
            self.shim.guard(optimizer)

    def state(self) -> dict[str, Any]:
        """What a checkpoint holds: each component's state dict and the RNG states."""
        state = {name: component.state_dict() for name, component in self.components.items()}
        state[RNG_KEY] = rng_states()
        if self.data is not None:
            state[DATA_KEY] = self.data.state()
        return state

    def restore(self) -> RestoreResult | None:
        """Load the newest checkpoint into the components (rescaled if the DP size changed)."""
        result = self.shim.restore(self.state(), plan=self.plan)
        self.restored = result
        self._batches = None
        if result is not None:
            self.plan = result.plan
        if self.data is not None:
            self.data.bind(self.shim, self.plan)
        if result is None:
            return None
        for name, component in self.components.items():
            component.load_state_dict(result.state[name])
        set_rng_states(result.state[RNG_KEY])
        if self.data is not None:
            self.data.load(result.state[DATA_KEY])
        self.step = result.step
        return result

    @property
    def accumulation_steps(self) -> int:
        """Micro-batches per optimizer step on this rank: the batch plan's at this
        data-parallel size (1 without a plan)."""
        return 1 if self.plan is None else self.plan.accumulation_steps(self.shim.layout.dp_size)

    def micro_batches(self) -> Iterator[Any]:
        """This step's micro-batches from the loader given as ``data=``: as many as
        :attr:`accumulation_steps`, the next epoch begun where one ends."""
        if self.data is None:
            raise RuntimeError("micro_batches() needs the loader: SupervisedLoop(data=loader)")
        for _ in range(self.accumulation_steps):
            if self._batches is None:
                self._batches = self._iterate()
            try:
                yield next(self._batches)
            except StopIteration:
                self._batches = self._iterate()
                yield next(self._batches)

    def _iterate(self) -> Iterator[Any]:
        """A new pass over the loader. A ``DataLoader`` draws its workers' seed from the
        global RNG when a pass starts, and a resumed job starts one where the uninterrupted
        run did not: the draw is kept out of the training's RNG stream (the workers' own
        randomness is the loader's; only a stateful loader resumes it)."""
        assert self.data is not None
        with torch.random.fork_rng(devices=[]):
            return iter(self.data.loader)

    def steps(self, total_steps: int) -> Iterator[int]:
        """Restore, then yield each step number to run (from 1); call :meth:`step_done` in
        the body. Ends at ``total_steps`` or on a stop request, after the final save."""
        self.restore()
        try:
            while self.step < total_steps:
                if self._skips_next():
                    continue
                self._loss = None
                self._started = time.perf_counter()
                yield self.step + 1
                if self._loss is None:
                    raise RuntimeError("call loop.step_done(loss, tokens) in every step")
                if self._complete_step(final=self.step + 1 >= total_steps):
                    break
        except GeneratorExit:  # the script left the loop: save where it is
            if self._loss is not None:  # inside a step it reported: that step is done
                # reported without the vote: a rank leaving alone (an exception) would wait
                # in it forever for peers that go on
                self._count_step()
                self.shim.step_done(
                    self.step, time.perf_counter() - self._started, self._tokens, self._loss
                )
            self.shim.finish(self.state(), self.step)
            raise
        self.shim.finish(self.state(), self.step)

    def _skips_next(self) -> bool:
        """Skip the next step (a loss spike's window, ``shim.skips_data``): its micro-batches
        are drawn from the loader and not trained on, and the step counts as done. Only the
        loop's own loader can be advanced: without ``data=`` the step is run (one error line)."""
        if not self.shim.skips_data(self.step + 1):
            return False
        if self.data is None:
            if not self._told_no_skip:
                log.error("steps to skip, but the loop has no data=: it trains on their batches")
                self._told_no_skip = True
            return False
        for _ in self.micro_batches():
            pass
        self._count_step()
        self.skipped.append(self.step)
        return True

    def _count_step(self) -> None:
        self.step += 1
        if self.data is not None and self.plan is not None:
            self.data.advance(self.plan.global_batch)

    def _complete_step(self, *, final: bool) -> bool:
        """The step protocol's end of the step (report, vote, save); True: stop after it."""
        assert self._loss is not None
        self._count_step()
        loss, self._loss = self._loss, None
        return end_step(
            self.shim,
            self.step,
            step_time_s=time.perf_counter() - self._started,
            tokens=self._tokens,
            loss=loss,
            state=self.state,
            vote=self._vote,
            final=final,
        )

    def step_done(
        self,
        loss: float | torch.Tensor,
        tokens: int = 0,
        grad_norm: float | torch.Tensor | None = None,
    ) -> None:
        """The step's loss (a float or a 0-d tensor), tokens and gradient norm (what
        ``clip_grad_norm_`` returned), after its optimizer step. Tensors stay on their device:
        the numerics monitor (``goodput.shim.numerics``) reads them once a window, and the
        step event carries the newest loss it read, so no step waits for the device. The
        ``model`` component's parameters are fingerprinted when due."""
        parameters = replicated(self.components.get("model"))
        self.shim.numerics.observe(self.step + 1, loss, grad_norm, parameters)
        tensor = isinstance(loss, torch.Tensor)
        self._loss = self.shim.numerics.last_loss if tensor else float(loss)
        self._tokens = tokens
