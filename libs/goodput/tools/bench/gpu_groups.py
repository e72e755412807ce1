"""`goodput bench gpu` phases B, C and E: NCCL groups as an in-process restart handles them,
and the per-step vote, through the shim's own code (``shim.group_abort``,
``shim.step_faults``) and `goodput bench shim`.

B: a one-rank NCCL group created (first collective synchronized), then aborted as an
in-process restart aborts it (:class:`~goodput.shim.group_abort.GroupAbort`), 20 times over:
each creation's and abort's latency, and the device memory in use after each abort (what
``cudaMemGetInfo`` sees: NCCL's buffers are not torch's allocator's), so a leak shows as a
climb. C: a device-side assert (an out-of-range index on a CUDA tensor), then the abort and a
new group: the error each step reads and how ``step_faults.classify`` names it, showing the
context stays poisoned and the rank must leave cold. E: `goodput bench shim --device cuda`,
whose modes hold the shim with its pipelined vote and the old blocking vote.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from goodput.launch.rank_env import NCCL_ERROR_HANDLING
from goodput.shim.group_abort import GroupAbort
from goodput.tools.bench.gpu_phases import emit, one_line, say

ROUNDS = 20
#: how long an abort, or a re-creation after a poisoned context, may take before it is
#: reported as hanging (the shim's own abort deadline is a setting; this is the phase's)
HANG_S = 10.0


def _device() -> torch.device:
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    return device


def _create(work: Path, generation: int, device: torch.device) -> None:
    """A one-rank NCCL group (a fresh store each time, as a restarted job's), its first
    collective run: NCCL sets the communicator up at creation (``device_id``)."""
    store = dist.FileStore(str(work / f"store-{generation}"), 1)
    dist.init_process_group(
        "nccl", store=store, rank=0, world_size=1, timeout=timedelta(seconds=60),
        device_id=device,
    )  # fmt: skip
    value = torch.ones(1, device=device)
    dist.all_reduce(value)
    torch.cuda.synchronize(device)


def _abort() -> str:
    """The in-process restart's abort; "" once done, else why it failed or hangs."""
    abort = GroupAbort()
    reason = abort.wait(HANG_S)
    if not reason:
        abort.release().join(HANG_S)
    return reason


def _used_bytes(device: torch.device) -> int:
    free, total = torch.cuda.mem_get_info(device)
    return total - free


def _spread(values: list[float]) -> dict[str, float]:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def phase_b(args: argparse.Namespace) -> dict[str, Any]:
    os.environ.update(NCCL_ERROR_HANDLING)  # as goodput's launchers set it for a rank
    device = _device()
    torch.zeros(1, device=device)
    torch.cuda.synchronize(device)
    used = [_used_bytes(device)]  # the context alone, before any group
    create_s, abort_s = [], []
    for generation in range(ROUNDS):
        started = time.perf_counter()
        _create(args.work, generation, device)
        create_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        reason = _abort()
        abort_s.append(time.perf_counter() - started)
        if reason:
            raise RuntimeError(f"round {generation + 1}: {reason}")
        torch.cuda.synchronize(device)
        used.append(_used_bytes(device))
        if generation % 5 == 4:
            say(f"B: {generation + 1} rounds, device memory in use {used[-1] / 2**20:.0f} MiB")
            emit("partial", {"rounds": generation + 1, "device_used_bytes": used})
    return {
        "rounds": ROUNDS,
        "first_create_s": create_s[0],
        "recreate_s": _spread(create_s[1:]),
        "abort_s": _spread(abort_s),
        "device_used_bytes": {"before": used[0], "after_each_abort": used[1:]},
        "leaked_bytes_per_round_after_the_first": (used[-1] - used[1]) / (ROUNDS - 1),
        "torch_reserved_bytes": torch.cuda.memory_reserved(device),
        "notes": "create: init_process_group with device_id + a synchronized all_reduce;"
        " abort: shim.group_abort.GroupAbort (the in-process restart's), then its release;"
        " device memory: cudaMemGetInfo total - free",
    }


def _raised(call: Callable[[], object]) -> BaseException | None:
    try:
        call()
    except Exception as error:
        return error
    return None


def _read(error: BaseException | None) -> dict[str, Any] | None:
    from goodput.shim.step_faults import classify

    if error is None:
        return None
    fault = classify(error)
    return {
        "error": one_line(error),
        "error_code": getattr(error, "error_code", None),
        "kind": fault.kind,
        "reason": fault.reason,
    }


def _bounded(call: Callable[[], object]) -> dict[str, Any]:
    """``call`` on a thread, waited on for ``HANG_S``: what it raised, or that it hangs."""
    outcome: dict[str, Any] = {"returned": False}

    def run() -> None:
        outcome["error"] = _read(_raised(call))
        outcome["returned"] = True

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_S)
    if not outcome["returned"]:
        outcome["hangs"] = f"did not return within {HANG_S:g} s"
    return outcome


def phase_c(args: argparse.Namespace) -> dict[str, Any]:
    os.environ.update(NCCL_ERROR_HANDLING)
    device = _device()
    _create(args.work, 0, device)
    x = torch.zeros(4, device=device)
    assert_error = _raised(lambda: _index_out_of_range(x))
    if assert_error is None:
        raise RuntimeError("an out-of-range index on a CUDA tensor raised nothing")
    say(f"C: the assert read as {_read(assert_error)}")
    figures: dict[str, Any] = {"assert": _read(assert_error)}
    emit("partial", figures)
    abort = _bounded(lambda: _raise_if(_abort()))
    figures["abort"] = abort
    figures["recreate"] = _bounded(lambda: _create(args.work, 1, device))
    later = _bounded(lambda: (x + 1).sum().item())
    figures["cuda_call_after"] = later
    error = later.get("error")
    figures["rank_must_go_cold"] = bool(error and error["kind"] == "context")
    figures["notes"] = (
        "a sticky error survives the abort and a new group: every later CUDA call fails the"
        " same, so in-process restart cannot reuse this process (step_faults: kind context)"
    )
    return figures


def _index_out_of_range(x: torch.Tensor) -> None:
    """Index ``x`` past its end on the device: the kernel's assert fails and poisons the
    context (as tests/gpu/test_gpu_step_faults.py); the error surfaces at the synchronize."""
    x[torch.tensor([x.numel() + 3], device=x.device)]
    torch.cuda.synchronize(x.device)


def _raise_if(reason: str) -> None:
    if reason:
        raise RuntimeError(reason)


def phase_e(args: argparse.Namespace) -> dict[str, Any]:
    from goodput.bus.embedded import free_port
    from goodput.tools.bench import shim
    from goodput.tools.bench.shim_loop import LoopSpec

    spec = LoopSpec(
        device="cuda", width=512, depth=4, batch=64, steps=20, repeats=5, world=2, port=free_port()
    )
    report = shim.run_benchmark(spec)
    modes = report["modes"]
    return {
        "shim_with_pipelined_vote_overhead_ms": modes["shim"]["overhead_ms"],
        "blocking_vote_overhead_ms": modes["vote_blocking"]["overhead_ms"],
        "bench_shim": report,
    }
