"""``TrainingHooks`` over a local directory: torch.save every k steps, restore newest, SIGTERM."""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import FrameType
from typing import Any

import torch

from goodput import schemas
from goodput.launch.rank_env import skipped
from goodput.schemas.tiers import SHARED
from goodput.shim.collectives import broadcast_object, grouped
from goodput.shim.dp_layout import DpLayout
from goodput.shim.rescale import BatchPlan, RescaleCallback
from goodput.shim.restore_result import (
    CheckpointMetadata,
    RestoreResult,
    resolve_restore,
    with_metadata,
)

log = logging.getLogger(__name__)

_CHECKPOINT_NAME = re.compile(r"^step-(\d{8})\.pt$")


def checkpoint_path(directory: Path, step: int) -> Path:
    return directory / f"step-{step:08d}.pt"


def list_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """Committed checkpoints, newest first (temp files of interrupted writes are not listed)."""
    if not directory.is_dir():
        return []
    found = []
    for entry in directory.iterdir():
        match = _CHECKPOINT_NAME.match(entry.name)
        if match:
            found.append((int(match.group(1)), entry))
    return sorted(found, reverse=True)


def snapshot(value: Any) -> Any:
    """A copy of a state tree whose tensors training can no longer change."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {key: snapshot(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(snapshot(item) for item in value)
    return value


def write_atomically(state: dict[str, Any], path: Path) -> None:
    """torch.save to a temp name, fsync, rename, fsync the directory: all or nothing."""
    temp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(temp, "wb") as file:
        torch.save(state, file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temp, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def load_checkpoint(path: Path, template_state: dict[str, Any]) -> dict[str, Any]:
    """Load and check the top-level structure; raises on a corrupt or foreign file."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict):
        raise ValueError(f"{path} holds a {type(state).__name__}, not a training state")
    missing = set(template_state) - set(state)
    if missing:
        raise ValueError(f"{path} lacks {sorted(missing)}")
    return state


class LocalFileHooks:
    """Rank 0 writes (the state is replicated by DDP); every rank reads the same file.

    Saves run on one background thread after a synchronous in-memory snapshot, so a save costs
    the training loop only a copy; at most one write is in flight.
    """

    def __init__(
        self,
        directory: str | Path,
        every: int,
        rank: int = 0,
        world_size: int = 1,
        keep: int = 3,
        log_every: int = 10,
        handle_sigterm: bool = True,
        skip_steps: tuple[schemas.StepWindow, ...] = (),
    ) -> None:
        if keep < 1:
            raise ValueError("keep must be at least 1")
        self.directory = Path(directory)
        self.every = every
        self.rank = rank
        self.layout = DpLayout(world_size=world_size, dp_size=world_size)
        self.plan: BatchPlan | None = None
        self._rescale_callbacks: list[RescaleCallback] = []
        self.keep = keep
        self.log_every = log_every
        self.skip_steps = skip_steps
        self.directory.mkdir(parents=True, exist_ok=True)
        self._stop = threading.Event()
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-writer")
        self._pending: Future[None] | None = None
        self._last_saved_step: int | None = None
        self._previous_sigterm_handler: Any = None
        if handle_sigterm:
            self._previous_sigterm_handler = signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self._stop.set()

    def on_rescale(self, callback: RescaleCallback) -> RescaleCallback:
        self._rescale_callbacks.append(callback)
        return callback

    def restore(
        self, template_state: dict[str, Any], plan: BatchPlan | None = None
    ) -> RestoreResult | None:
        self.plan = plan
        chosen = self._newest_loadable(template_state) if self.rank == 0 else None
        if grouped():
            # Rank 0 picks, so every rank resumes from the same step even if files change.
            step = broadcast_object(None if chosen is None else chosen[0], src=0)
            if self.rank != 0 and step is not None:
                path = checkpoint_path(self.directory, step)
                chosen = (step, load_checkpoint(path, template_state))
        if chosen is None:
            return None
        self._last_saved_step = chosen[0]
        log.info("restored step %d from %s", chosen[0], self.directory)
        result, applied = resolve_restore(
            *chosen,
            tier=SHARED,
            layout=self.layout,
            plan=plan,
            callbacks=self._rescale_callbacks,
        )
        if result.rescaled:
            log.info("rescaled by %s: %s", ", ".join(applied) or "no callback", result.plan)
        self.plan = result.plan
        return result

    def _newest_loadable(self, template_state: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
        for step, path in list_checkpoints(self.directory):
            try:
                return step, load_checkpoint(path, template_state)
            except Exception as error:  # any unreadable file: fall back to the previous one
                log.warning("skipping unusable checkpoint %s: %s", path, error)
        return None

    def step_done(
        self, step: int, step_time_s: float, tokens: int, loss: float, compute_time_s: float = 0.0
    ) -> None:
        if self.rank == 0 and self.log_every > 0 and step % self.log_every == 0:
            log.info(
                "step %d loss %.4f %.1f ms %.0f tok/s",
                step,
                loss,
                step_time_s * 1e3,
                tokens / step_time_s,
            )

    def skips_data(self, step: int) -> bool:
        return skipped(step, self.skip_steps)

    def compute_slowdown(self) -> float:
        return 1.0

    def should_checkpoint(self, step: int) -> bool:
        return self.every > 0 and step % self.every == 0

    def save(self, state: dict[str, Any], step: int) -> None:
        self._last_saved_step = step
        if self.rank != 0:
            return
        self._wait_pending()
        frozen = snapshot(
            with_metadata(state, CheckpointMetadata(layout=self.layout, plan=self.plan))
        )
        self._pending = self._writer.submit(self._write, frozen, step)

    def _write(self, state: dict[str, Any], step: int) -> None:
        write_atomically(state, checkpoint_path(self.directory, step))
        for _, old in list_checkpoints(self.directory)[self.keep :]:
            old.unlink(missing_ok=True)

    def _wait_pending(self) -> None:
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()  # re-raises a failed write (full disk...) in the training loop

    def should_stop(self) -> bool:
        return self._stop.is_set()

    def request_stop(self) -> None:
        """Same as receiving SIGTERM."""
        self._stop.set()

    def finish(self, state: dict[str, Any], step: int) -> None:
        try:
            if self._last_saved_step != step:
                self.save(state, step)
            self._wait_pending()
        finally:
            self._writer.shutdown(wait=True)
            if self._previous_sigterm_handler is not None:
                signal.signal(signal.SIGTERM, self._previous_sigterm_handler)
                self._previous_sigterm_handler = None
