"""The timed saves of `goodput bench ckpt --sharded`: goodput's overlapped and blocking saves
and ``dcp.async_save``, each where it sits in training (see ``ckpt_sharded_rank``)."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from goodput.checkpoint.engine import CheckpointEngine, SaveHandle
from goodput.checkpoint.format import step_dir_name
from goodput.tools.bench.ckpt_sharded_state import (
    Rank,
    forward_backward,
    rotated,
    slowest,
    state_of,
)

#: the save methods, each repeat in a rotating order: goodput's overlapped (``shim.guard``)
#: and blocking saves, and ``dcp.async_save``
SAVE_METHODS = ("goodput", "goodput_blocking", "dcp")


class Durable:
    """Waits for a save to be durable on a thread, so the training loop goes on meanwhile;
    ``join`` returns the seconds from ``started`` to durable."""

    def __init__(self, wait: Callable[[], None], started: float) -> None:
        self._started, self._seconds = started, 0.0
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(wait,), daemon=True)
        self._thread.start()

    def _run(self, wait: Callable[[], None]) -> None:
        try:
            wait()
        except BaseException as exc:  # handed to join, on the training thread
            self._error = exc
        self._seconds = time.perf_counter() - self._started

    def join(self, timeout: float) -> float:
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"a save was not durable within {timeout:.0f} s")
        if self._error is not None:
            raise self._error
        return self._seconds


def engine_wait(handle: SaveHandle, timeout: float) -> Callable[[], None]:
    """Waiting for the engine's save until durable; a failed save raises, naming its step."""

    def wait() -> None:
        result = handle.wait(timeout)
        if result.error:
            raise RuntimeError(f"engine save of step {handle.step} failed: {result.error}")

    return wait


def timed_save(
    method: str, training: Training, state: Any, step: int, rank: Rank
) -> tuple[float, float]:
    """One save by ``method`` where it sits in training: the call, the next forward/backward,
    what must end before the optimizer changes the state (overlapped: the copy), the
    optimizer step. Returns the stall (the call plus that wait) and the durable time."""
    timeout = rank.args.timeout
    dist.barrier()
    started = time.perf_counter()
    if method == "dcp":
        future = dcp.async_save(
            state, checkpoint_id=training.shared / step_dir_name(step), process_group=training.group
        )
        assert isinstance(future, Future)  # without a stager, async_save answers the upload's
        wait: Callable[[], None] = lambda: future.result(timeout)  # noqa: E731
    else:
        handle = training.engine.save(
            state,
            step,
            overlap=method == "goodput",
            dp_rank=rank.local,
            dp_world=rank.local_world,
        )
        wait = engine_wait(handle, timeout)
    called = time.perf_counter()
    durable = Durable(wait, started)
    forward_backward(training.model, step + 1)
    passed = time.perf_counter()
    training.engine.wait_snapshot()  # what the guard's hook waits for (nothing if not overlapped)
    stall = called - started + time.perf_counter() - passed
    training.optim.step()
    training.optim.zero_grad()
    return stall, durable.join(timeout)


@dataclass(frozen=True)
class Training:
    """What every save works with: the model and its optimizer, goodput's engine (guarding
    the optimizer, as ``shim.guard``), DCP's shared directory and its process group."""

    model: torch.nn.Sequential
    optim: torch.optim.Optimizer
    engine: CheckpointEngine
    shared: Path
    group: dist.ProcessGroup


def save_repeats(training: Training, rank: Rank) -> tuple[list[dict[str, float]], int]:
    """The timed saves (one untimed save of each first: all pay their one-time set-up,
    threads and connections); returns their figures and the last step saved."""
    saves: list[dict[str, float]] = []
    step = 0
    for repeat in range(-1, rank.args.repeats):
        figures: dict[str, float] = {}
        for method in rotated(SAVE_METHODS, repeat):
            step += 1
            state = state_of(training.model, training.optim, step)
            stall, durable = timed_save(method, training, state, step, rank)
            figures[f"{method}_stall_s"] = slowest(stall)
            figures[f"{method}_durable_s"] = slowest(durable)
        if repeat < 0:
            continue
        saves.append(figures)
        if rank.rank == 0:
            print(f"save {repeat}: {json.dumps(figures)}", file=sys.stderr, flush=True)
    return saves, step
