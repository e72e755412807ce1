"""The numerics monitor with CUDA tensors on a group that serves CUDA only (``cuda:gloo``, as
NCCL serves: one GPU cannot hold two NCCL ranks), and the fingerprint's hashing bandwidth."""

from __future__ import annotations

import time

import torch

from goodput.shim.numerics import fingerprint
from tests.gpu.kit import GPU
from tests.shim.test_numerics import assert_flip_and_nan_found, run_replicas

pytestmark = GPU


def test_replicas_compared_with_cuda_tensors() -> None:
    assert_flip_and_nan_found(run_replicas("cuda:gloo", "cuda"))


def test_fingerprint_bandwidth() -> None:
    """Prints GB/s of ``fingerprint`` over 8 GiB of bf16 parameters in 1 GiB tensors (what
    a rank's shard of a large model looks like), after a warm-up."""
    params = [torch.randn(512 * 1024 * 1024, device="cuda", dtype=torch.bfloat16) for _ in range(8)]
    fingerprint(params[:1])
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(3):
        value = fingerprint(params)
    torch.cuda.synchronize()
    seconds = (time.perf_counter() - started) / 3
    size = sum(p.numel() * p.element_size() for p in params)
    print(f"fingerprint: {size / seconds / 1e9:.0f} GB/s over {size / 2**30:.0f} GiB ({value})")
    assert size / seconds > 1e11  # 100 GB/s at the very least on any datacenter GPU
