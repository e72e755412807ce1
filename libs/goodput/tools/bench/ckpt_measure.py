"""One method of `goodput bench ckpt` inside a real training loop, timed and checked.

Each save sits where it would in training: ``save`` is called after an optimizer step, the
next forward/backward runs, then the method's ``ready()`` (what must end before the state
changes) and ``optimizer.step()``, which changes every parameter and Adam tensor in place.
The stall is the time training waits: the ``save`` call plus the wait in ``ready()``.
Durability is watched from a thread, so it is timed from the save call to its fsync whatever
the training loop is doing. The state's digests are taken right before the last save and
compared with the state the method restores (from a cold page cache): a method whose
restored state differs has read tensors after the optimizer changed them: it is unsafe.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import torch
import xxhash

from goodput.checkpoint.engine.buffers import byte_view
from goodput.tools.bench.ckpt_savers import Saver

GB = 1e9


@dataclass
class Training:
    """A model of Linear layers plus Adam state (12 bytes per parameter), DCP-style dicts,
    on ``device`` (the CPU, or a GPU: then each phase ends when the GPU has run it)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    state: dict[str, Any]
    nbytes: int
    width: int
    batch: int
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    def forward_backward(self) -> None:
        self.model(torch.randn(self.batch, self.width, device=self.device)).sum().backward()
        self.sync()

    def step(self) -> None:
        self.optimizer.step()

    def sync(self) -> None:
        """Wait until the training stream has run what was queued on it: on a GPU the host
        returns from a launch at once, and the time training loses is the stream's."""
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()


def build_training(size_gb: float, batch: int, device: str = "cpu") -> Training:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    params = max(1, int(size_gb * GB / 12))
    width = 4096 if params >= 4 * 4096 * 4096 else 1024
    layers = max(1, round(params / (width * width + width)))
    where = torch.device(device)
    if where.type == "cuda" and where.index is None:
        where = torch.device("cuda", torch.cuda.current_device())
    # initialized where it lives, not on the CPU and then copied: `bench gpu` builds a 16 GB
    # model within its phase's time budget
    model = torch.nn.Sequential(
        *[torch.nn.Linear(width, width, device=where) for _ in range(layers)]
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    training = Training(model, optimizer, {}, 0, width, batch, where)
    training.forward_backward()
    training.step()  # Adam state exists; gradients stay allocated (zero_grad keeps them)
    optimizer.zero_grad(set_to_none=False)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    training.state = {"model": model_sd, "optim": optim_sd, "step": 1, "rng": torch.get_rng_state()}
    training.nbytes = sum(t.numel() * t.element_size() for t in tensors_of(training.state))
    return training


def tensors_of(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensors_of(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from tensors_of(item)


def digests(state: Any) -> list[int]:
    """One xxh3_64 per tensor, in visiting order (restored states keep the saved structure)."""
    return [
        xxhash.xxh3_64_intdigest(byte_view(t.detach().cpu()).numpy().data)
        for t in tensors_of(state)
    ]


class PageCache:
    """Empties the page cache for a directory: drop_caches where allowed, else fadvise."""

    def __init__(self) -> None:
        self.method = "drop_caches"

    def drop(self, directory: Path) -> None:
        os.sync()
        if self.method == "drop_caches":
            try:
                Path("/proc/sys/vm/drop_caches").write_text("1\n")
                return
            except OSError:
                self.method = "fadvise_dontneed"
        for folder, _, names in os.walk(directory):
            for name in names:
                fd = os.open(os.path.join(folder, name), os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)


def _return_free_memory_to_os() -> None:
    """glibc keeps freed heap memory resident and reuses it without raising RSS, which would
    hide a method's allocations; trimming first makes every new allocation show."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class PeakRss:
    """Samples this process's RSS in a thread; ``peak_extra`` is the peak above the start."""

    def __init__(self, interval_s: float = 0.002) -> None:
        _return_free_memory_to_os()
        self._process = psutil.Process()
        self._interval = interval_s
        self._stop = threading.Event()
        self.baseline = self._process.memory_info().rss
        self.peak = self.baseline
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._process.memory_info().rss)
            time.sleep(self._interval)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._process.memory_info().rss)

    @property
    def peak_extra(self) -> int:
        return max(0, self.peak - self.baseline)


@dataclass
class MethodResult:
    stall_s: float
    durable_s: float
    write_gbps: float
    restore_s: float
    restore_gbps: float
    peak_extra_mem_ratio: float
    consistent: bool
    forward_backward_s: float
    stall_first_s: float = 0.0
    stalls_s: list[float] = field(default_factory=list)
    durables_s: list[float] = field(default_factory=list)
    bytes_on_disk: int = 0


def _warm_median(values: list[float]) -> float:
    return statistics.median(values[1:] if len(values) > 1 else values)


def _dir_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class _Watch:
    """Waits for durability in a thread and notes when it came."""

    def __init__(self, wait_durable: Callable[[], Path]) -> None:
        self.path: Path | None = None
        self.at = 0.0
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(wait_durable,), daemon=True)
        self._thread.start()

    def _run(self, wait_durable: Callable[[], Path]) -> None:
        try:
            self.path = wait_durable()
        except BaseException as exc:  # re-raised in the training thread by join()
            self.error = exc
        self.at = time.perf_counter()

    def join(self) -> Path:
        self._thread.join()
        if self.error is not None:
            raise self.error
        assert self.path is not None
        return self.path


def measure(saver: Saver, training: Training, saves: int, cache: PageCache) -> MethodResult:
    stalls, durables, sizes, passes = [], [], [], []
    at_last_save: list[int] = []
    last: Path | None = None
    with PeakRss() as rss:
        for index in range(saves):
            if index == saves - 1:
                at_last_save = digests(training.state)
            started = time.perf_counter()
            watch = _Watch(saver.save(index + 1))
            called = time.perf_counter()
            training.forward_backward()
            passed = time.perf_counter()
            saver.ready()
            training.sync()  # on a GPU: what the optimizer step would wait for on its stream
            stalls.append(called - started + time.perf_counter() - passed)
            passes.append(passed - called)
            training.step()
            training.optimizer.zero_grad(set_to_none=False)
            last = watch.join()
            durables.append(watch.at - started)
            sizes.append(_dir_bytes(last))
            saver.prune(last)
    assert last is not None
    saver.close()
    gc.collect()
    cache.drop(last.parent)
    started = time.perf_counter()
    restored = saver.restore(last)
    restore_s = time.perf_counter() - started
    consistent = digests(restored) == at_last_save
    del restored
    durable = _warm_median(durables)
    return MethodResult(
        stall_s=_warm_median(stalls),
        durable_s=durable,
        write_gbps=statistics.median(sizes) / durable / GB,
        restore_s=restore_s,
        restore_gbps=training.nbytes / restore_s / GB,
        peak_extra_mem_ratio=rss.peak_extra / training.nbytes,
        consistent=consistent,
        forward_backward_s=_warm_median(passes),
        stall_first_s=stalls[0],
        stalls_s=stalls,
        durables_s=durables,
        bytes_on_disk=sizes[-1],
    )


def forward_backward_alone(training: Training, repeats: int = 3) -> float:
    """The forward/backward time without any save, to see what a background copy costs it."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        training.forward_backward()
        times.append(time.perf_counter() - started)
        training.optimizer.zero_grad(set_to_none=False)
    return statistics.median(times)
