"""The snapshot copy's threads: a share of the host's cores per rank, the saving thread among them."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from goodput.checkpoint.engine import CheckpointEngine, snapshot
from goodput.checkpoint.engine import engine as engine_module
from goodput.checkpoint.engine.buffers import HostBuffer, slice_nbytes
from goodput.checkpoint.engine.parts_commit import PartLayout
from goodput.checkpoint.engine.plan import make_plan
from goodput.checkpoint.engine.snapshot import Snapshotter, copy_threads_for


@pytest.mark.parametrize(
    ("cores", "local_ranks", "threads"),
    [
        (2, 1, 2),  # one rank: every core
        (2, 2, 1),  # two ranks on two cores: one each, not two each
        (2, 6, 1),  # more ranks than cores: still one, the saving thread
        (32, 8, 4),
        (96, 8, 8),  # at most MAX_COPY_THREADS: a copy is memory bound
        (64, 1, 8),
        (7, 2, 3),  # a share rounds down: 2 x 3 <= 7
        (1, 0, 1),  # nonsense counts still give one thread
    ],
)
def test_each_rank_copies_with_its_share_of_the_cores(
    cores: int, local_ranks: int, threads: int
) -> None:
    assert copy_threads_for(cores, local_ranks) == threads
    assert copy_threads_for(cores, local_ranks) * max(1, local_ranks) <= max(cores, local_ranks)


def _tensors() -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [torch.randn(3000), torch.randn(50, 70), torch.arange(1000, dtype=torch.int64)]


def _copy(
    threads: int, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[torch.Tensor], torch.Tensor, snapshot.PendingCopy, set[int]]:
    """Copy :func:`_tensors` in 4 KiB chunks with ``threads``; the threads that copied."""
    monkeypatch.setattr(snapshot, "COPY_CHUNK_BYTES", 4096)
    copiers: set[int] = set()
    real = snapshot._copy_pieces

    def recorded(pieces: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        copiers.add(threading.get_ident())
        time.sleep(0.05)  # keeps each run busy, so each pool run gets a thread of its own
        real(pieces)

    monkeypatch.setattr(snapshot, "_copy_pieces", recorded)
    tensors = _tensors()
    plan = make_plan(tensors)
    buffer = HostBuffer(slice_nbytes(plan))
    copier = Snapshotter(threads)
    try:
        pending = copier.start(tensors, plan, buffer)
        pending.wait()
    finally:
        copier.close()
    return tensors, buffer.data, pending, copiers


def _holds(tensors: list[torch.Tensor], data: torch.Tensor) -> bool:
    plan = make_plan(tensors)
    return all(
        torch.equal(data[e.offset : e.offset + e.nbytes], t.reshape(-1).view(torch.uint8))
        for t, e in zip(tensors, plan.tensors, strict=True)
    )


def test_one_thread_copies_on_the_saving_thread_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    tensors, data, pending, copiers = _copy(1, monkeypatch)
    assert copiers == {threading.get_ident()}
    assert len(pending.futures) == 1 and pending.done()
    assert _holds(tensors, data)


def test_the_saving_thread_copies_one_run_and_the_pool_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tensors, data, pending, copiers = _copy(3, monkeypatch)
    assert threading.get_ident() in copiers and len(copiers) == 3
    assert len(pending.futures) == 3
    assert _holds(tensors, data)


def test_a_failed_run_on_the_saving_thread_is_raised_after_the_pool_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The buffer is only given back once no thread writes into it any more."""
    main = threading.get_ident()
    finished: list[float] = []

    def copy_or_fail(pieces: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        if threading.get_ident() == main:
            raise RuntimeError("injected copy failure")
        time.sleep(0.2)
        finished.append(time.monotonic())

    monkeypatch.setattr(snapshot, "_copy_pieces", copy_or_fail)
    tensors = _tensors()
    plan = make_plan(tensors)
    copier = Snapshotter(2)
    try:
        pending = copier.start(tensors, plan, HostBuffer(slice_nbytes(plan)))
        with pytest.raises(RuntimeError, match="injected copy failure"):
            pending.wait()
        assert len(finished) == 1  # the pool's run had ended before the failure was raised
    finally:
        copier.close()


def test_the_engine_shares_the_cores_among_the_parts_local_ranks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[int] = []
    monkeypatch.setattr(
        engine_module, "default_copy_threads", lambda ranks: asked.append(ranks) or 1
    )
    layout = PartLayout(
        part=1, parts=3, rank=3, world=6, local_rank=1, local_world=2, namespace="j"
    )
    for kwargs in ({"parts": layout}, {"local_ranks": 8}, {}):
        CheckpointEngine(tmp_path / str(len(asked)), **kwargs).close()
    assert asked == [2, 8, 1]
