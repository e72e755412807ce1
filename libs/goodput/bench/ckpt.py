"""`goodput bench ckpt`: checkpoint stall, durability, bandwidth and restore, against baselines.

For one state (a model plus its Adam optimizer, about --size-gb on the CPU) it measures
torch.save, dcp.save, dcp.async_save and goodput's CheckpointEngine, and the raw sequential
write/read bandwidth of the same directory (dd with direct IO), so every figure is also a
fraction of what the disk can do. Restores are measured with a cold page cache.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import math
import os
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
import torch
from rich.console import Console
from rich.table import Table

from goodput.ckpt import CheckpointEngine

GB = 1e9
METHODS = ("torch_save", "dcp_save", "dcp_async_save", "goodput")
_console = Console(stderr=True)


# -- the state ------------------------------------------------------------------------------


def build_state(size_gb: float) -> tuple[dict[str, Any], int]:
    """A model of Linear layers plus Adam state (12 bytes per parameter), DCP-style dicts."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    params = max(1, int(size_gb * GB / 12))
    width = 4096 if params >= 4 * 4096 * 4096 else 1024
    layers = max(1, round(params / (width * width + width)))
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    model(torch.randn(2, width)).sum().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd, "step": 1, "rng": torch.get_rng_state()}
    nbytes = sum(
        t.numel() * t.element_size() for t in _tensors(state) if isinstance(t, torch.Tensor)
    )
    return state, nbytes


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _tensors(item)


# -- measuring helpers ----------------------------------------------------------------------


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


def _dir_bytes(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _dd(args: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(["dd", *args, "status=none"], check=True, capture_output=True)
    return time.perf_counter() - started


def raw_bandwidth(directory: Path, nbytes: int, cache: PageCache) -> tuple[float, float, str]:
    """Sequential write+fsync and cold read GB/s of ``directory`` with dd (direct IO if allowed)."""
    block = 64 << 20
    count = max(1, math.ceil(nbytes / block))
    target = directory / "raw-bandwidth.bin"
    mode = "direct"
    try:
        write_s = _dd(["if=/dev/zero", f"of={target}", f"bs={block}", f"count={count}",
                       "oflag=direct", "conv=fsync"])  # fmt: skip
    except subprocess.CalledProcessError:
        mode = "buffered"
        write_s = _dd(["if=/dev/zero", f"of={target}", f"bs={block}", f"count={count}",
                       "conv=fsync"])  # fmt: skip
    cache.drop(directory)
    read_args = [f"if={target}", "of=/dev/null", f"bs={block}"]
    read_s = _dd([*read_args, "iflag=direct"] if mode == "direct" else read_args)
    size = target.stat().st_size
    target.unlink()
    return size / write_s / GB, size / read_s / GB, mode


# -- one method -----------------------------------------------------------------------------


@dataclass
class MethodResult:
    stall_s: float
    durable_s: float
    write_gbps: float
    persist_gbps: float
    restore_s: float
    restore_gbps: float
    peak_extra_mem_ratio: float
    stall_first_s: float = 0.0
    stalls_s: list[float] = field(default_factory=list)
    durables_s: list[float] = field(default_factory=list)
    bytes_on_disk: int = 0


@dataclass
class Saver:
    """How one method saves (returning a wait-until-durable callable) and restores."""

    save: Callable[[int], Callable[[], Path]]
    restore: Callable[[Path], None]
    background: bool = False  # persists after save() returns (then persist = durable - stall)
    prune: Callable[[Path], None] = lambda path: None
    close: Callable[[], None] = lambda: None


def _warm_median(values: list[float]) -> float:
    return statistics.median(values[1:] if len(values) > 1 else values)


def measure(saver: Saver, saves: int, state_bytes: int, cache: PageCache) -> MethodResult:
    stalls, durables, sizes = [], [], []
    last: Path | None = None
    with PeakRss() as rss:
        for index in range(saves):
            started = time.perf_counter()
            wait_durable = saver.save(index + 1)
            stalls.append(time.perf_counter() - started)
            last = wait_durable()
            durables.append(time.perf_counter() - started)
            sizes.append(_dir_bytes(last))
            saver.prune(last)
    assert last is not None
    saver.close()
    gc.collect()
    cache.drop(last.parent)
    started = time.perf_counter()
    saver.restore(last)
    restore_s = time.perf_counter() - started
    durable = _warm_median(durables)
    persists = (
        [d - s for d, s in zip(durables, stalls, strict=True)] if saver.background else durables
    )
    return MethodResult(
        stall_s=_warm_median(stalls),
        durable_s=durable,
        write_gbps=statistics.median(sizes) / durable / GB,
        persist_gbps=statistics.median(sizes) / _warm_median(persists) / GB,
        restore_s=restore_s,
        restore_gbps=state_bytes / restore_s / GB,
        peak_extra_mem_ratio=rss.peak_extra / state_bytes,
        stall_first_s=stalls[0],
        stalls_s=stalls,
        durables_s=durables,
        bytes_on_disk=sizes[-1],
    )


def _keep_only(newest: Path) -> None:
    """Baselines keep only their newest save on disk (the engine does its own retention)."""
    for old in newest.parent.iterdir():
        if old == newest:
            continue
        shutil.rmtree(old, ignore_errors=True) if old.is_dir() else old.unlink(missing_ok=True)


def torch_save_saver(state: dict, directory: Path) -> Saver:
    def save(step: int) -> Callable[[], Path]:
        path = directory / f"state-{step}.pt"
        torch.save(state, path)

        def durable() -> Path:
            _fsync_path(path)
            _fsync_path(directory)
            return path

        return durable

    def restore(path: Path) -> None:
        loaded = torch.load(path, map_location="cpu")
        del loaded

    return Saver(save, restore, prune=_keep_only)


def dcp_saver(state: dict, directory: Path, *, asynchronous: bool) -> Saver:
    import torch.distributed.checkpoint as dcp

    def save(step: int) -> Callable[[], Path]:
        path = directory / f"dcp-{step}"
        future = dcp.async_save(state, checkpoint_id=path) if asynchronous else None
        if not asynchronous:
            dcp.save(state, checkpoint_id=path)

        def durable() -> Path:
            if future is not None:
                future.result()
            return path

        return durable

    def restore(path: Path) -> None:
        dcp.load(state, checkpoint_id=path)

    return Saver(save, restore, background=asynchronous, prune=_keep_only)


def goodput_saver(state: dict, directory: Path, writer_threads: int) -> Saver:
    engine = CheckpointEngine(directory, keep_last=1, writer_threads=writer_threads)

    def save(step: int) -> Callable[[], Path]:
        handle = engine.save(state, step)

        def durable() -> Path:
            result = handle.wait()
            if not result.ok:
                raise RuntimeError(f"goodput save failed: {result.error}")
            return Path(result.path or "")

        return durable

    def restore(path: Path) -> None:
        engine.restore(into=state)

    # Like the baselines' pruning, retention finishes between saves (outside the timings),
    # as it would in training, where saves are many steps apart.
    return Saver(
        save,
        restore,
        background=True,
        prune=lambda path: engine.wait_until_idle(),
        close=engine.close,
    )


# -- the command ----------------------------------------------------------------------------


def run_benchmark(
    size_gb: float, directory: Path, saves: int, writer_threads: int
) -> dict[str, Any]:
    cache = PageCache()
    with _console.status("building state (model + Adam)…"):
        state, state_bytes = build_state(size_gb)
    _console.log(f"state: {state_bytes / GB:.2f} GB in {len(list(_tensors(state)))} tensors")
    samples: list[tuple[float, float]] = []
    with _console.status("raw dd bandwidth…"):
        write_gbps, read_gbps, dd_mode = raw_bandwidth(directory, state_bytes, cache)
    samples.append((write_gbps, read_gbps))
    _console.log(f"raw ({dd_mode}): write {write_gbps:.2f} GB/s, read {read_gbps:.2f} GB/s")
    factories = {
        "torch_save": lambda d: torch_save_saver(state, d),
        "dcp_save": lambda d: dcp_saver(state, d, asynchronous=False),
        "dcp_async_save": lambda d: dcp_saver(state, d, asynchronous=True),
        "goodput": lambda d: goodput_saver(state, d, writer_threads),
    }
    results: dict[str, MethodResult] = {}
    for name in METHODS:
        method_dir = directory / name
        method_dir.mkdir()
        with _console.status(f"{name}: {saves} saves + cold restore…"):
            results[name] = measure(factories[name](method_dir), saves, state_bytes, cache)
        shutil.rmtree(method_dir, ignore_errors=True)
        gc.collect()
        r = results[name]
        _console.log(
            f"{name}: stall {r.stall_s:.3f}s durable {r.durable_s:.2f}s "
            f"write {r.write_gbps:.2f} GB/s restore {r.restore_s:.2f}s"
        )
    with _console.status("raw dd bandwidth again…"):
        write_gbps, read_gbps, _ = raw_bandwidth(directory, state_bytes, cache)
    samples.append((write_gbps, read_gbps))
    raw_write = max(sample[0] for sample in samples)
    raw_read = max(sample[1] for sample in samples)
    ours = results["goodput"]
    return {
        "size_gb": size_gb,
        "state_bytes": state_bytes,
        "dir": str(directory),
        "saves_per_method": saves,
        "raw_write_gbps": raw_write,
        "raw_read_gbps": raw_read,
        "raw_samples_gbps": [{"write": w, "read": r} for w, r in samples],
        "raw_io": f"dd bs=64M {dd_mode} (write with conv=fsync), best of before/after",
        "cache_drop": cache.method,
        "cuda": torch.cuda.is_available(),
        "notes": {
            "stall_s, durable_s": "median over saves after the first (stall_first_s: cold)",
            "write_gbps": "bytes on disk / durable_s (from the save call until fsynced)",
            "persist_gbps": "bytes on disk / time persisting: durable - stall where the"
            " method persists in the background, else durable",
            "raw": "fractions use the best raw sample (the disk is shared and noisy)",
            "restore": "torch.load into new tensors; dcp.load and goodput in place",
            "peak_extra_mem_ratio": "peak RSS above the start of the first save / state size",
        },
        "methods": {name: asdict(result) for name, result in results.items()},
        "goodput_vs": {
            "stall_fraction_of_torch_save": ours.stall_s / results["torch_save"].stall_s,
            "stall_fraction_of_dcp_async_save": ours.stall_s / results["dcp_async_save"].stall_s,
            "write_fraction_of_raw": ours.write_gbps / raw_write,
            "persist_fraction_of_raw": ours.persist_gbps / raw_write,
            "restore_fraction_of_raw": ours.restore_gbps / raw_read,
            "peak_extra_mem_ratio": ours.peak_extra_mem_ratio,
        },
    }


def _print_table(report: dict[str, Any]) -> None:
    table = Table(title=f"checkpoint of {report['state_bytes'] / GB:.2f} GB ({report['dir']})")
    for column in ("method", "stall s", "durable s", "write GB/s", "persist GB/s", "persist % raw",
                   "restore s", "restore GB/s", "% raw read", "peak extra mem (x state)"):  # fmt: skip
        table.add_column(column, justify="right")
    for name, m in report["methods"].items():
        table.add_row(
            name,
            f"{m['stall_s']:.3f}",
            f"{m['durable_s']:.2f}",
            f"{m['write_gbps']:.2f}",
            f"{m['persist_gbps']:.2f}",
            f"{100 * m['persist_gbps'] / report['raw_write_gbps']:.0f}%",
            f"{m['restore_s']:.2f}",
            f"{m['restore_gbps']:.2f}",
            f"{100 * m['restore_gbps'] / report['raw_read_gbps']:.0f}%",
            f"{m['peak_extra_mem_ratio']:.2f}",
        )
    Console().print(table)
    Console().print(
        f"raw: write {report['raw_write_gbps']:.2f} GB/s, read {report['raw_read_gbps']:.2f} GB/s"
        f" ({report['raw_io']}); cache drop: {report['cache_drop']}"
    )
    Console().print({k: round(v, 3) for k, v in report["goodput_vs"].items()})


def run(args: argparse.Namespace) -> int:
    warnings.filterwarnings("ignore", module="torch.distributed")
    parent = Path(args.dir) if args.dir else None
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix="goodput-bench-ckpt-", dir=parent))
    try:
        report = run_benchmark(args.size_gb, directory, args.saves, args.writer_threads)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_table(report)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "ckpt",
        help="checkpoint stall / write / restore vs torch.save and torch.distributed.checkpoint",
        description=__doc__,
    )
    parser.add_argument("--size-gb", type=float, default=2.0, help="state size (model + Adam)")
    parser.add_argument("--dir", help="directory to benchmark (default: the system temp dir)")
    parser.add_argument("--saves", type=int, default=3, help="saves per method (first is cold)")
    parser.add_argument("--writer-threads", type=int, default=4)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run)
