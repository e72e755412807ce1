"""How each method of `goodput bench ckpt` saves, waits, and restores, at its best options.

A ``Saver`` has four moments: ``save(step)`` (the call training makes), ``ready()`` (what the
training loop must wait for before the optimizer changes the state: nothing for blocking
methods, the end of staging for async ones), the returned wait-until-durable callable, and
``restore(path)`` (returning the restored state, to check it against the saved one).

Peers: torch.save; DCP's ``dcp.save`` and ``dcp.async_save`` with its default options and with
the torch 2.13 staging options (``DefaultStager`` with async staging, in a thread or in a
checkpoint process); goodput's DCP StorageWriter/Reader through the same ``dcp.async_save`` /
``dcp.load`` calls; torchsnapshot's ``async_take`` when installed (``goodput[peers]``).
"""

from __future__ import annotations

import contextlib
import gc
import importlib.util
import shutil
import socket
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from goodput.checkpoint.engine import CheckpointEngine


@dataclass
class Saver:
    """How one method saves (returning a wait-until-durable callable) and restores."""

    save: Callable[[int], Callable[[], Path]]
    restore: Callable[[Path], Any]
    ready: Callable[[], None] = lambda: None
    prune: Callable[[Path], None] = lambda path: None
    close: Callable[[], None] = lambda: None


def keep_only(newest: Path) -> None:
    """Baselines keep only their newest save on disk (the engine does its own retention)."""
    for old in newest.parent.iterdir():
        if old == newest:
            continue
        shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink(missing_ok=True)


def fsync_path(path: Path) -> None:
    import os

    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def torch_save_saver(state: dict, directory: Path) -> Saver:
    def save(step: int) -> Callable[[], Path]:
        path = directory / f"state-{step}.pt"
        torch.save(state, path)

        def durable() -> Path:
            fsync_path(path)
            fsync_path(directory)
            return path

        return durable

    def restore(path: Path) -> Any:
        return torch.load(path, map_location="cpu", weights_only=False)

    return Saver(save, restore, prune=keep_only)


def dcp_saver(state: dict, directory: Path, *, asynchronous: bool) -> Saver:
    """DCP with its defaults: ``dcp.save``, or ``dcp.async_save`` (staging inside the call)."""
    import torch.distributed.checkpoint as dcp

    def save(step: int) -> Callable[[], Path]:
        path = directory / f"dcp-{step}"
        future = dcp.async_save(state, checkpoint_id=path) if asynchronous else None
        # without a stager, async_save answers the upload's Future
        assert future is None or isinstance(future, Future)
        if not asynchronous:
            dcp.save(state, checkpoint_id=path)

        def durable() -> Path:
            if future is not None:
                future.result()
            return path

        return durable

    def restore(path: Path) -> Any:
        dcp.load(state, checkpoint_id=path)
        return state

    return Saver(save, restore, prune=keep_only)


def dcp_staged_saver(
    state: dict,
    directory: Path,
    writer_threads: int,
    *,
    process: bool,
    goodput_io: bool,
    cuda: bool = False,
) -> Saver:
    """``dcp.async_save`` with ``DefaultStager`` async staging (torch 2.13 staging options).

    The staging copy runs in a background thread; training must wait for its
    ``staging_completion`` before the optimizer changes the state. ``process`` moves the
    writing into DCP's checkpoint process (staging into shared memory). ``goodput_io`` writes
    and reads through goodput's DCP StorageWriter/Reader instead of DCP's file system ones.
    Either writer writes with ``writer_threads`` threads, as goodput's engine does (DCP's
    file system writer defaults to one). A ``cuda`` state is staged as DCP stages it best:
    into pinned memory with non-blocking copies.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter, StorageWriter
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    from torch.distributed.checkpoint.state_dict_saver import (
        AsyncCheckpointerType,
        AsyncSaveResponse,
    )

    from goodput.checkpoint.engine.dcp_storage import GoodputStorageReader, GoodputStorageWriter

    stager = DefaultStager(
        StagingOptions(
            use_pinned_memory=cuda,
            use_shared_memory=process,
            use_async_staging=True,
            use_non_blocking_copy=cuda,
        )
    )
    kind = AsyncCheckpointerType.PROCESS if process else AsyncCheckpointerType.THREAD
    staging: list[Any] = []

    def save(step: int) -> Callable[[], Path]:
        writer: StorageWriter
        if goodput_io:
            writer = GoodputStorageWriter(directory, step, keep_last=1, thread_count=writer_threads)
            path = directory / f"step-{step:010d}"
        else:
            path = directory / f"dcp-{step}"
            writer = FileSystemWriter(path, thread_count=writer_threads)
        response = dcp.async_save(
            state, storage_writer=writer, async_checkpointer_type=kind, async_stager=stager
        )
        # an asynchronous stager's save answers both futures, staging and upload
        assert isinstance(response, AsyncSaveResponse)
        staging.append(response.staging_completion)

        def durable() -> Path:
            response.upload_completion.result()
            return path

        return durable

    def ready() -> None:
        while staging:
            staging.pop().result()

    def restore(path: Path) -> Any:
        if goodput_io:
            dcp.load(state, storage_reader=GoodputStorageReader(path.parent))
        else:
            dcp.load(state, checkpoint_id=path)
        return state

    def close() -> None:
        stager.close()
        if process:
            _stop_dcp_checkpoint_process()

    return Saver(
        save,
        restore,
        ready=ready,
        prune=lambda p: None if goodput_io else keep_only(p),
        close=close,
    )


def _stop_dcp_checkpoint_process() -> None:
    """DCP keeps its checkpoint process for the life of the caller; end it after the method."""
    from torch.distributed.checkpoint import _async_process_executor as executor

    process = executor._CHECKPOINT_PROCESS
    executor._CHECKPOINT_PROCESS = None
    del process  # its __del__ asks the process to terminate and joins it
    gc.collect()


def goodput_saver(
    state: dict,
    directory: Path,
    writer_threads: int,
    optimizer: torch.optim.Optimizer | None,
) -> Saver:
    """The engine with overlapped snapshots, the optimizer-step guard the only wait; without
    an ``optimizer``, blocking snapshots (the copy inside the call), as ``TrainerShim.save``
    and the integrations save, which hold no optimizer to guard."""
    engine = CheckpointEngine(directory, keep_last=1, writer_threads=writer_threads)
    hook = engine.guard(optimizer) if optimizer is not None else None

    def save(step: int) -> Callable[[], Path]:
        handle = engine.save(state, step, overlap=hook is not None)

        def durable() -> Path:
            result = handle.wait()
            if not result.ok:
                raise RuntimeError(f"goodput save failed: {result.error}")
            return Path(result.path or "")

        return durable

    def restore(path: Path) -> Any:
        engine.restore(into=state)
        return state

    def close() -> None:
        if hook is not None:
            hook.remove()
        engine.close()

    # Like the baselines' pruning, retention finishes between saves (outside the timings),
    # as it would in training, where saves are many steps apart. ``ready`` is the guard's
    # wait, which the optimizer step runs itself.
    return Saver(
        save,
        restore,
        ready=engine.wait_snapshot,
        prune=lambda p: engine.wait_until_idle(),
        close=close,
    )


def torchsnapshot_saver(state: dict, directory: Path) -> Saver:
    """torchsnapshot's ``async_take``: returns once the state is staged, writes in background."""
    from torchsnapshot import Snapshot, StateDict

    app_state = {"state": StateDict(**state)}

    def save(step: int) -> Callable[[], Path]:
        path = directory / f"snapshot-{step}"
        pending = Snapshot.async_take(path=str(path), app_state=app_state)

        def durable() -> Path:
            pending.wait()
            return path

        return durable

    def restore(path: Path) -> Any:
        Snapshot(path=str(path)).restore(app_state)
        state.update(app_state["state"])
        return state

    return Saver(save, restore, prune=keep_only)


def unavailable_peers() -> dict[str, str]:
    """Peers this run cannot measure, each with why (installed by ``pip install goodput[peers]``)."""
    missing = {}
    if importlib.util.find_spec("torchsnapshot") is None:
        missing["torchsnapshot_async_take"] = "torchsnapshot not installed (goodput[peers])"
    if importlib.util.find_spec("nvidia_resiliency_ext") is None:
        missing["nvrx_async"] = "nvidia-resiliency-ext not installed (goodput[peers])"
    else:
        missing["nvrx_async"] = (
            "nvidia-resiliency-ext is installed, but its async checkpoint and local manager"
            " call torch.cuda.synchronize() and stage through CUDA; not measured by this bench"
        )
    return missing


@contextlib.contextmanager
def single_rank_group() -> Iterator[None]:
    """A 1-rank gloo group: DCP's checkpoint process needs one to exist."""
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()
