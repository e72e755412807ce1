"""`goodput bench ckpt`: checkpoint stall, durability and restore, against the peers.

For one state (a model plus its Adam optimizer, about --size-gb, on the CPU or, with
--device cuda, on a GPU) each method saves inside a real training loop (see
goodput.tools.bench.ckpt_measure for what is timed and how every method's restored state is
checked against the state at save time). By default it compares
goodput's CheckpointEngine — overlapped (``goodput``: the copy runs on during the next
forward/backward, the optimizer step waits for it) and blocking (``goodput_blocking``: the
copy inside the call, as ``TrainerShim.save`` and the integrations save) — with torch.save,
dcp.save and dcp.async_save; --peers adds each
peer at its best options (goodput.tools.bench.ckpt_savers) and reports goodput / best safe peer.
The raw sequential write/read bandwidth of the same directory (dd, direct IO) is measured
before and after, so every figure is also a fraction of what the disk can do. Restores are
measured with a cold page cache. --sharded runs goodput.tools.bench.ckpt_sharded instead: a
state sharded across nodes, the engine's parts against DCP.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import shutil
import subprocess
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.table import Table

from goodput.tools.bench.arguments import device as device_arg
from goodput.tools.bench.arguments import positive_int
from goodput.tools.bench.ckpt_measure import (
    GB,
    MethodResult,
    PageCache,
    Training,
    build_training,
    forward_backward_alone,
    measure,
)
from goodput.tools.bench.ckpt_savers import (
    Saver,
    dcp_saver,
    dcp_staged_saver,
    goodput_saver,
    single_rank_group,
    torch_save_saver,
    torchsnapshot_saver,
    unavailable_peers,
)

#: goodput's own methods: overlapped, and blocking as the shim saves (both always measured)
OWN_METHODS = ("goodput", "goodput_blocking")
METHODS = ("torch_save", "dcp_save", "dcp_async_save", *OWN_METHODS)
PEERS = (
    "torch_save",
    "dcp_async_save",
    "dcp_async_thread_staged",
    "dcp_async_process_staged",
    "goodput_dcp_writer",
    "torchsnapshot_async_take",
)
_console = Console(stderr=True)
SIZE_GB = 2.0
#: the sharded benchmark runs nodes x procs-per-node ranks on one machine
SHARDED_SIZE_GB = 0.25


def factories(training: Training, writer_threads: int) -> dict[str, Callable[[Path], Saver]]:
    state = training.state
    cuda = training.device.type == "cuda"
    return {
        "goodput": lambda d: goodput_saver(state, d, writer_threads, training.optimizer),
        "goodput_blocking": lambda d: goodput_saver(state, d, writer_threads, None),
        "torch_save": lambda d: torch_save_saver(state, d),
        "dcp_save": lambda d: dcp_saver(state, d, asynchronous=False),
        "dcp_async_save": lambda d: dcp_saver(state, d, asynchronous=True),
        "dcp_async_thread_staged": lambda d: dcp_staged_saver(
            state, d, writer_threads, process=False, goodput_io=False, cuda=cuda
        ),
        "dcp_async_process_staged": lambda d: dcp_staged_saver(
            state, d, writer_threads, process=True, goodput_io=False, cuda=cuda
        ),
        "goodput_dcp_writer": lambda d: dcp_staged_saver(
            state, d, writer_threads, process=False, goodput_io=True, cuda=cuda
        ),
        "torchsnapshot_async_take": lambda d: torchsnapshot_saver(state, d),
    }


def _device_name(device: torch.device) -> str:
    """The card a CUDA run used (benchmark figures name it), else "cpu"."""
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def _ratio(ours: float, theirs: float | None) -> float | None:
    return None if theirs is None or theirs <= 0 else ours / theirs


def vs_best_peer(results: dict[str, MethodResult]) -> dict[str, Any]:
    """goodput / the best peer: stall and durable against safe peers, restore against all.

    goodput's own DCP storage (``goodput_dcp_writer``) is not a peer: it is compared with
    DCP's own writer instead (``goodput_dcp_writer_vs_dcp_writer``).
    """
    peers = {name: r for name, r in results.items() if not name.startswith("goodput")}
    safe = {name: r for name, r in peers.items() if r.consistent}
    ours = results["goodput"]

    def best(pool: dict[str, MethodResult], key: str) -> tuple[str | None, float | None]:
        if not pool:
            return None, None
        name = min(pool, key=lambda n: getattr(pool[n], key))
        return name, getattr(pool[name], key)

    report: dict[str, Any] = {}
    for figure, key, pool in (
        ("stall", "stall_s", safe),
        ("durable", "durable_s", safe),
        ("restore", "restore_s", peers),
    ):
        name, value = best(pool, key)
        report[figure] = _ratio(getattr(ours, key), value)
        report[f"{figure}_best_peer"] = name
    report["peak_extra_mem_ratio"] = ours.peak_extra_mem_ratio
    report["unsafe_peers"] = sorted(set(peers) - set(safe))
    return report


def _dcp_writers(results: dict[str, MethodResult]) -> dict[str, float | None] | None:
    """goodput's DCP StorageWriter/Reader / DCP's own, through the same async_save / load."""
    ours, theirs = results.get("goodput_dcp_writer"), results.get("dcp_async_thread_staged")
    if ours is None or theirs is None:
        return None
    return {
        "stall": _ratio(ours.stall_s, theirs.stall_s),
        "durable": _ratio(ours.durable_s, theirs.durable_s),
        "restore": _ratio(ours.restore_s, theirs.restore_s),
    }


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


# -- the command ----------------------------------------------------------------------------


def run_benchmark(
    size_gb: float,
    directory: Path,
    saves: int,
    writer_threads: int,
    *,
    peers: bool = False,
    batch: int = 16,
    device: str = "cpu",
) -> dict[str, Any]:
    cache = PageCache()
    with _console.status(f"building state (model + Adam) on {device}…"):
        training = build_training(size_gb, batch, device)
    state_bytes = training.nbytes
    fb_alone = forward_backward_alone(training)
    _console.log(
        f"state: {state_bytes / GB:.2f} GB; forward/backward of batch {batch}: {fb_alone:.2f}s"
    )
    samples: list[tuple[float, float]] = []
    with _console.status("raw dd bandwidth…"):
        write_gbps, read_gbps, dd_mode = raw_bandwidth(directory, state_bytes, cache)
    samples.append((write_gbps, read_gbps))
    _console.log(f"raw ({dd_mode}): write {write_gbps:.2f} GB/s, read {read_gbps:.2f} GB/s")
    skipped = unavailable_peers() if peers else {}
    names = [*OWN_METHODS, *(name for name in PEERS if name not in skipped)] if peers else METHODS
    methods = factories(training, writer_threads)
    results: dict[str, MethodResult] = {}
    for name in names:
        method_dir = directory / name
        method_dir.mkdir()
        group = single_rank_group() if name == "dcp_async_process_staged" else None
        with (
            _console.status(f"{name}: {saves} saves in training + cold restore…"),
            group or contextlib.nullcontext(),
        ):
            try:
                results[name] = measure(methods[name](method_dir), training, saves, cache)
            except Exception as error:
                if name in OWN_METHODS or not peers:
                    raise
                # a peer this torch breaks (torch 2.11's DCP staging of CUDA state, say) is
                # reported as such; the others' figures still stand
                skipped[name] = f"failed: {type(error).__name__}: {error}"
        shutil.rmtree(method_dir, ignore_errors=True)
        gc.collect()
        if name not in results:
            continue
        r = results[name]
        _console.log(
            f"{name}: stall {r.stall_s:.3f}s durable {r.durable_s:.2f}s "
            f"restore {r.restore_s:.2f}s consistent {r.consistent}"
        )
    for name, why in skipped.items():
        _console.log(f"{name}: not measured: {why}")
    with _console.status("raw dd bandwidth again…"):
        write_gbps, read_gbps, _ = raw_bandwidth(directory, state_bytes, cache)
    samples.append((write_gbps, read_gbps))
    raw_write = max(sample[0] for sample in samples)
    raw_read = max(sample[1] for sample in samples)
    ours = results["goodput"]
    report: dict[str, Any] = {
        "size_gb": size_gb,
        "state_bytes": state_bytes,
        "dir": str(directory),
        "saves_per_method": saves,
        "writer_threads": writer_threads,
        "batch": batch,
        "forward_backward_alone_s": fb_alone,
        "raw_write_gbps": raw_write,
        "raw_read_gbps": raw_read,
        "raw_samples_gbps": [{"write": w, "read": r} for w, r in samples],
        "raw_io": f"dd bs=64M {dd_mode} (write with conv=fsync), best of before/after",
        "cache_drop": cache.method,
        "cuda": torch.cuda.is_available(),
        "device": str(training.device),
        "device_name": _device_name(training.device),
        "notes": {
            "stall_s": "median over saves after the first of: the save call + the wait before"
            " optimizer.step() (stall_first_s: cold, allocating buffers)",
            "durable_s": "median, from the save call until durable (fsynced), watched from a"
            " thread while training goes on",
            "forward_backward_s": "median forward/backward right after the save call (compare"
            " forward_backward_alone_s: what a background copy costs training)",
            "consistent": "the restored tensors equal the state right before the last save,"
            " which optimizer.step() changed right after the method allowed it",
            "restore": "cold page cache; torch.load into new tensors, the others in place",
            "writer_threads": "goodput, the staged DCP saves and goodput's DCP writer write"
            " with this many threads; dcp_save and dcp_async_save keep DCP's defaults",
            "peak_extra_mem_ratio": "peak RSS of this process above the start / state size"
            " (a checkpoint process's memory is not in it)",
            "raw": "fractions use the best raw sample (the disk is shared and noisy)",
        },
        "methods": {name: asdict(result) for name, result in results.items()},
        "goodput_vs": {
            "write_fraction_of_raw": ours.write_gbps / raw_write,
            "restore_fraction_of_raw": ours.restore_gbps / raw_read,
            "peak_extra_mem_ratio": ours.peak_extra_mem_ratio,
        },
    }
    if peers:
        report["vs_best_peer"] = vs_best_peer(results)
        report["goodput_dcp_writer_vs_dcp_writer"] = _dcp_writers(results)
        report["peers_not_measured"] = skipped
    else:
        report["goodput_vs"]["stall_fraction_of_torch_save"] = _ratio(
            ours.stall_s, results["torch_save"].stall_s
        )
        report["goodput_vs"]["stall_fraction_of_dcp_async_save"] = _ratio(
            ours.stall_s, results["dcp_async_save"].stall_s
        )
    return report


def _print_table(report: dict[str, Any]) -> None:
    table = Table(title=f"checkpoint of {report['state_bytes'] / GB:.2f} GB ({report['dir']})")
    for column in ("method", "stall s", "durable s", "write GB/s", "restore s", "restore GB/s",
                   "% raw read", "peak extra mem (x state)", "fwd/bwd s", "consistent"):  # fmt: skip
        table.add_column(column, justify="right")
    for name, m in report["methods"].items():
        table.add_row(
            name,
            f"{m['stall_s']:.3f}",
            f"{m['durable_s']:.2f}",
            f"{m['write_gbps']:.2f}",
            f"{m['restore_s']:.2f}",
            f"{m['restore_gbps']:.2f}",
            f"{100 * m['restore_gbps'] / report['raw_read_gbps']:.0f}%",
            f"{m['peak_extra_mem_ratio']:.2f}",
            f"{m['forward_backward_s']:.2f}",
            "yes" if m["consistent"] else "[red]NO (unsafe)[/red]",
        )
    console = Console()
    console.print(table)
    console.print(
        f"raw: write {report['raw_write_gbps']:.2f} GB/s, read {report['raw_read_gbps']:.2f} GB/s"
        f" ({report['raw_io']}); cache drop: {report['cache_drop']};"
        f" forward/backward alone {report['forward_backward_alone_s']:.2f}s"
    )
    for key in ("goodput_vs", "vs_best_peer", "goodput_dcp_writer_vs_dcp_writer"):
        if report.get(key):
            console.print(key, {
                k: round(v, 3) if isinstance(v, float) else v for k, v in report[key].items()
            })  # fmt: skip
    for name, why in report.get("peers_not_measured", {}).items():
        console.print(f"{name}: not measured: {why}")


def run(args: argparse.Namespace) -> int:
    if args.sharded:  # another benchmark: its own module, its rank processes
        from goodput.tools.bench.ckpt_sharded import run as run_sharded

        if args.size_gb is None:
            args.size_gb = SHARDED_SIZE_GB
        return run_sharded(args)
    if args.size_gb is None:
        args.size_gb = SIZE_GB
    warnings.filterwarnings("ignore", module="torch.distributed")
    warnings.filterwarnings("ignore", module="torchsnapshot")
    parent = Path(args.dir) if args.dir else None
    if parent is not None:
        parent.mkdir(parents=True, exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix="goodput-bench-ckpt-", dir=parent))
    try:
        report = run_benchmark(
            args.size_gb,
            directory,
            args.saves,
            args.writer_threads,
            peers=args.peers,
            batch=args.batch,
            device=args.device,
        )
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
        help="checkpoint stall / durable / restore vs torch.save, DCP and other peers",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--size-gb",
        type=float,
        help=f"state size (model + Adam; default {SIZE_GB}, with --sharded {SHARDED_SIZE_GB})",
    )
    parser.add_argument("--dir", help="directory to benchmark (default: the system temp dir)")
    parser.add_argument(
        "--saves", type=positive_int, default=3, help="saves per method (the first is cold)"
    )
    parser.add_argument("--writer-threads", type=positive_int, default=4)
    parser.add_argument(
        "--batch",
        type=positive_int,
        default=16,
        help="rows per forward/backward of the training loop the saves sit in",
    )
    parser.add_argument(
        "--peers",
        action="store_true",
        help="compare with every installed peer at its best options and report goodput / best"
        " peer (torchsnapshot and nvidia-resiliency-ext come with goodput[peers])",
    )
    parser.add_argument(
        "--device",
        type=device_arg,
        default="cpu",
        help="where the model and Adam state live: cpu, or cuda (the current GPU, or cuda:N);"
        " with cuda every save copies from the GPU and every stall waits for its stream",
    )
    sharded = parser.add_argument_group(
        "--sharded",
        "an FSDP2 state sharded over a mesh spanning nodes (gloo rank processes here, a volume"
        " per node): the engine's parts + global commit vs dcp.async_save into one shared"
        " directory, and a replaced node's restore from its peer vs dcp.load; --saves repeats",
    )
    sharded.add_argument("--sharded", action="store_true", help="run this benchmark instead")
    sharded.add_argument(
        "--nodes", type=positive_int, default=3, help="nodes (the last is replaced)"
    )
    sharded.add_argument("--procs-per-node", type=positive_int, default=2, help="ranks per node")
    sharded.add_argument(
        "--timeout", type=float, default=1800.0, help="seconds before the ranks are stopped"
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.set_defaults(func=run)
