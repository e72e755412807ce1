"""What the replicas' parameter fingerprint (``goodput.shim.numerics.fingerprint``) costs: its
hashing bandwidth on this machine's CPU, the example job's share of a step, and a large
model's cost by arithmetic from a named bandwidth figure (issue 39).

Part of ``goodput bench detect``: the share needs the example job's median step, which that
benchmark measures on the same job whose replicas it fingerprints. The bandwidth is measured
before the stack starts, so the job's ranks do not share the CPU with it.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Iterator, Sequence

import torch

from goodput.shim.numerics import fingerprint

#: the bandwidth a large model's cost is worked out from, each with where it comes from. The
#: CPU's is measured here and is not a GPU's; the H200's is the module's sum measured on one
#: (docs/BENCHMARKS.md, "Numerics and fingerprints", 2026-11-28, bf16; the sum is not
#: memory-bound there); the H100's is its memory's peak, a lower bound on the time only: the
#: reduction's real speed on an H100 is not measured
H200_MEASURED_BF16_GBS = 398.0
H100_SXM_HBM3_PEAK_GBS = 3350.0  # NVIDIA H100 Tensor Core GPU datasheet, SXM5: 3.35 TB/s
#: the parameter set the CPU's bandwidth is measured over, per dtype
PARAMETER_SET_BYTES = 256 * 2**20
#: transformer widths whose layers (attention 4 d², MLP 8 d², two norms) make up that set:
#: tensors of 0.5-32 MB, as a real model's
WIDTHS = (512, 1024, 2048)
DTYPES = (torch.float32, torch.bfloat16)
#: the most a fingerprint may cost, as a share of a step (issue 39)
BUDGET_SHARE = 0.01


def layer_shapes(width: int) -> list[tuple[int, ...]]:
    """One transformer layer's parameter shapes at ``width``: qkv, output, MLP in and out, two
    norms."""
    return [(3 * width, width), (width, width), (4 * width, width), (width, 4 * width)] + [
        (width,)
    ] * 2


def parameter_set(width: int, dtype: torch.dtype, total_bytes: int) -> list[torch.Tensor]:
    """Whole layers at ``width`` until ``total_bytes`` of ``dtype`` are reached (at least one)."""
    shapes = layer_shapes(width)
    per_layer = sum(torch.Size(s).numel() for s in shapes) * torch.finfo(dtype).bits // 8
    layers = max(1, round(total_bytes / per_layer))
    return [torch.rand(shape).to(dtype) for _ in range(layers) for shape in shapes]


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Torch on one thread, as the example's ranks run (``torch.set_num_threads(1)``): a
    rank's fingerprint runs on its own thread, and two threads on a loaded machine wait for
    each other (outliers of hundreds of ms on this VM)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def timed_fingerprint(parameters: Sequence[torch.Tensor]) -> float:
    """Seconds one fingerprint of ``parameters`` takes, its value read (the host sync)."""
    began = time.perf_counter()
    fingerprint(parameters).item()
    return time.perf_counter() - began


def bandwidth_gbs(repeats: int = 3, total_bytes: int = PARAMETER_SET_BYTES) -> dict[str, dict]:
    """Per dtype, the fingerprint's bandwidth on one core of this machine's CPU (GB/s, 10^9
    bytes): min, median and max over every width's repeats, the set's size, and each figure."""
    report: dict[str, dict] = {}
    with one_thread():
        for dtype in DTYPES:
            report[str(dtype).removeprefix("torch.")] = _bandwidth(dtype, repeats, total_bytes)
    return report


def _bandwidth(dtype: torch.dtype, repeats: int, total_bytes: int) -> dict:
    by_width: dict[int, dict] = {}
    for width in WIDTHS:
        parameters = parameter_set(width, dtype, total_bytes)
        size = sum(p.numel() * p.element_size() for p in parameters)
        timed_fingerprint(parameters)  # warm-up: first touch, allocator
        each = [size / timed_fingerprint(parameters) / 1e9 for _ in range(repeats)]
        by_width[width] = {"bytes": size, "gbs": [round(f, 2) for f in each]}
        del parameters
    figures = [f for width in by_width.values() for f in width["gbs"]]
    return {
        "min": min(figures),
        "median": round(statistics.median(figures), 2),
        "max": max(figures),
        "by_width": by_width,
    }


def example_fingerprint_s(repeats: int = 20) -> dict[str, float]:
    """The example job's model (``goodput.examples.gpt``, its default sizes, as the benchmark
    starts it): parameters, bytes, and one fingerprint's seconds on one thread, the median
    and the largest of ``repeats``."""
    from goodput.examples.gpt.model import GPT, ModelConfig

    parameters = list(GPT(ModelConfig()).parameters())
    with one_thread():
        timed_fingerprint(parameters)  # warm-up: the first call pays torch's lazy set-up
        times = [timed_fingerprint(parameters) for _ in range(repeats)]
    return {
        "parameters": sum(p.numel() for p in parameters),
        "bytes": sum(p.numel() * p.element_size() for p in parameters),
        "fingerprint_s": round(statistics.median(times), 6),
        "fingerprint_max_s": round(max(times), 6),
    }


def share_per_step(fingerprint_s: float, fingerprint_every: int, step_s: float) -> float:
    """A fingerprint every ``fingerprint_every`` steps, as a share of a ``step_s`` step."""
    if fingerprint_every < 1 or step_s <= 0:
        raise ValueError("fingerprint_every must be positive, step_s more than 0")
    return fingerprint_s / fingerprint_every / step_s


def projected(
    parameters: float,
    bytes_per_parameter: int,
    tensor_parallel: int,
    bandwidth_gbs: float,
    fingerprint_every: int,
) -> dict[str, float]:
    """A model's fingerprint cost per GPU from a bandwidth: each GPU sums its own tensor-parallel
    shard of the replicated weights (data parallelism replicates them; a sharded data-parallel
    model, FSDP2 or ZeRO-3, is not fingerprinted at all). Seconds per fingerprint, per step
    amortised, and the shortest step it stays within :data:`BUDGET_SHARE` of."""
    if min(parameters, bytes_per_parameter, tensor_parallel, bandwidth_gbs) <= 0:
        raise ValueError("parameters, bytes, tensor parallelism and bandwidth must be positive")
    per_gpu = parameters * bytes_per_parameter / tensor_parallel
    seconds = per_gpu / (bandwidth_gbs * 1e9)
    per_step = seconds / fingerprint_every
    return {
        "bytes_per_gpu": per_gpu,
        "fingerprint_s": seconds,
        "per_step_s": per_step,
        "within_budget_for_steps_from_s": per_step / BUDGET_SHARE,
    }


def seventy_b_on_h100(cpu_bf16_gbs: float, fingerprint_every: int) -> dict[str, dict]:
    """Llama-70B-sized (70·10^9 bf16 parameters, tensor parallel 8 within an H100 node) at
    each named bandwidth: this CPU's (not an H100's: a slow bound), the H200's measured
    fingerprint, the H100's HBM3 peak (a floor)."""
    figures = {
        "this_cpu_measured_bf16": cpu_bf16_gbs,
        "h200_measured_bf16": H200_MEASURED_BF16_GBS,
        "h100_hbm3_peak": H100_SXM_HBM3_PEAK_GBS,
    }
    return {
        name: {"bandwidth_gbs": gbs, **projected(70e9, 2, 8, gbs, fingerprint_every)}
        for name, gbs in figures.items()
    }
