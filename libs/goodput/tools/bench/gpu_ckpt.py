"""`goodput bench gpu` phases A, F and G: checkpoints of CUDA state, through the measured
code of `goodput bench ckpt` (its training loop, savers and checks), not a copy of it.

A: at ``--size-gb`` (16 GB by default), the shim's save (``goodput_blocking``: the copy inside
the call, as ``TrainerShim.save``), the engine's overlapped save (``goodput``) and DCP's best
async staging (``dcp_async_thread_staged``: pinned memory, non-blocking copies, staging in a
thread); what pinning a host buffer of the state's size costs (the first save pays it); and
the bytes torch's caching host allocator holds before a method's saves and after its restore.
F: an FSDP2 state on a one-rank NCCL mesh saved through the engine's parts and restored onto
the GPU (the local shards through the bounded pinned buffer), against ``dcp.load``.
G: `goodput bench ckpt --device cuda --size-gb 4 --saves 2`, its report whole.
"""

from __future__ import annotations

import argparse
import gc
import shutil
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from goodput.checkpoint.engine.buffers import HostBuffer
from goodput.tools.bench import ckpt
from goodput.tools.bench.ckpt_measure import GB, PageCache, build_training, measure
from goodput.tools.bench.gpu_phases import emit, one_line, say

#: phase A's methods: the shim's blocking save, the engine's overlapped one, DCP's best
A_METHODS = ("goodput_blocking", "goodput", "dcp_async_thread_staged")
#: saves per method in A (the first pays for buffers and pinning; the second is warm)
A_SAVES = 2
WRITER_THREADS = 4
#: phase F's state (a one-rank mesh: every shard is local)
F_SIZE_GB = 1.0
#: phase G's state, as issue 38 asks, and its saves per method (the first cold, one warm:
#: five methods of 4 GB within G's budget)
G_SIZE_GB = 4.0
G_SAVES = 2


def _pool_bytes() -> dict[str, int | None]:
    """What torch's caching host allocator (pinned staging copies) holds now: the blocks it
    owns (in use or cached for reuse, never returned by itself) and those in use."""
    stats = torch.cuda.host_memory_stats() if torch.cuda.is_available() else {}
    return {
        "owned": stats.get("allocated_bytes.current"),
        "in_use": stats.get("active_bytes.current"),
    }


def pinning(nbytes: int) -> dict[str, Any]:
    """Allocating and page-locking (``cudaHostRegister``) a host buffer of ``nbytes``: what
    the engine's first save of a state that size pays, then never again; or why not taken."""
    started = time.perf_counter()
    buffer = HostBuffer(nbytes, pin=True)
    seconds = time.perf_counter() - started
    pinned = buffer.pinned
    buffer.release()
    if not pinned:
        return {"not_taken": f"cudaHostRegister refused a {nbytes / GB:.1f} GB host buffer"}
    return {"bytes": nbytes, "seconds": seconds}


def phase_a(args: argparse.Namespace, device: str = "cuda") -> dict[str, Any]:
    say(f"A: building a {args.size_gb:g} GB state (model + Adam) on {device}")
    training = build_training(args.size_gb, 16, device)
    figures: dict[str, Any] = {
        "state_bytes": training.nbytes,
        "saves_per_method": A_SAVES,
        "methods": {},
        "not_measured": {},
    }
    if training.device.type == "cuda":
        figures["pin_state_sized_buffer"] = pinning(training.nbytes)
        say(f"A: pinning a state-sized host buffer: {figures['pin_state_sized_buffer']}")
    emit("partial", figures)
    cache = PageCache()
    makers = ckpt.factories(training, WRITER_THREADS)
    for name in A_METHODS:
        directory = args.work / f"A-{name}"
        directory.mkdir(parents=True, exist_ok=True)
        before = _pool_bytes()
        try:
            result = measure(makers[name](directory), training, A_SAVES, cache)
        except Exception as error:
            if name.startswith("goodput"):
                raise
            # DCP's stager failed on CUDA state under torch 2.11 (docs/BENCHMARKS.md)
            figures["not_measured"][name] = one_line(error)
            say(f"A: {name} not measured: {one_line(error)}")
            continue
        finally:
            shutil.rmtree(directory, ignore_errors=True)
            gc.collect()
        figures["methods"][name] = {
            "stall_s": result.stall_s,
            "first_save_stall_s": result.stall_first_s,
            "durable_s": result.durable_s,
            "restore_s": result.restore_s,
            "consistent": result.consistent,
            "peak_extra_host_mem_ratio": result.peak_extra_mem_ratio,
            "torch_pinned_pool_bytes": {"before_saves": before, "after_restore": _pool_bytes()},
        }
        say(f"A: {name}: stall {result.stall_s:.3f} s (first {result.stall_first_s:.3f} s)")
        emit("partial", figures)
    return figures


def _one_rank_group(work: Path, device: torch.device) -> None:
    """This process alone as a process group: NCCL on a GPU (gloo on the CPU)."""
    store = dist.FileStore(str(work / "store"), 1)
    if device.type == "cuda":
        torch.cuda.set_device(device)
        dist.init_process_group(
            "nccl", store=store, rank=0, world_size=1, timeout=timedelta(seconds=60),
            device_id=device,
        )  # fmt: skip
    else:
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)


def phase_f(args: argparse.Namespace, device: str = "cuda") -> dict[str, Any]:
    import torch.distributed.checkpoint as dcp

    from goodput.checkpoint.engine import CheckpointEngine
    from goodput.checkpoint.engine.parts_commit import PartLayout
    from goodput.tools.bench import ckpt_sharded_state as sharded

    where = torch.device(device, 0) if device == "cuda" else torch.device(device)
    _one_rank_group(args.work, where)
    model, optim = sharded.build(int(F_SIZE_GB * GB), 1, device)
    sharded.train_step(model, optim, 1)
    state = sharded.state_of(model, optim, 1)
    expected = [t.detach().clone() for t in sharded.local_tensors(state)]
    layout = PartLayout(
        part=0, parts=1, rank=0, world=1, local_rank=0, local_world=1, namespace="bench-gpu/F"
    )
    volume, cache = args.work / "F-volume", PageCache()
    with CheckpointEngine(volume, parts=layout, writer_threads=WRITER_THREADS) as engine:
        started = time.perf_counter()
        result = engine.save(state, 1, dp_rank=0, dp_world=1).wait(120)
        if result.error:
            raise RuntimeError(f"the engine's save failed: {result.error}")
        save_s = time.perf_counter() - started
    say(f"F: {sharded.state_bytes(state) / GB:.2f} GB saved in {save_s:.2f} s; restoring")
    sharded.zero(state)
    _sync(where)
    cache.drop(volume)
    with CheckpointEngine(volume, parts=layout, writer_threads=WRITER_THREADS) as engine:
        started = time.perf_counter()
        step, _ = engine.restore(1, into=state)
        _sync(where)
        restore_s = time.perf_counter() - started
    figures: dict[str, Any] = {
        "state_bytes": sharded.state_bytes(state),
        "save_s": save_s,
        "restore_s": restore_s,
        "restored_step": step,
        "consistent": sharded.same_bits(expected, state),
        "restored_on": sorted({str(t.device) for t in sharded.local_tensors(state)}),
    }
    emit("partial", figures)
    dcp.save(state, checkpoint_id=args.work / "F-dcp")
    sharded.zero(state)
    _sync(where)
    cache.drop(args.work / "F-dcp")
    started = time.perf_counter()
    dcp.load(state, checkpoint_id=args.work / "F-dcp")
    _sync(where)
    figures["dcp_load_s"] = time.perf_counter() - started
    figures["dcp_consistent"] = sharded.same_bits(expected, state)
    return figures


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def phase_g(args: argparse.Namespace, device: str = "cuda") -> dict[str, Any]:
    directory = args.work / "G"
    directory.mkdir(parents=True, exist_ok=True)
    try:
        return ckpt.run_benchmark(G_SIZE_GB, directory, G_SAVES, WRITER_THREADS, device=device)
    finally:
        shutil.rmtree(directory, ignore_errors=True)
