"""Trainer-side numerics: device accumulators read once a window, replica fingerprints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from goodput import schemas
from goodput.shim.numerics import NumericsMonitor, fingerprint, replica_splits
from tests.examples.launch import free_port
from tests.shim import fake_nccl
from tests.shim.test_collectives import DISPATCH_REFUSAL

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_every_single_bit_flip_changes_the_fingerprint(dtype: torch.dtype) -> None:
    torch.manual_seed(1)
    params = [torch.randn(7, dtype=torch.float32).to(dtype), torch.randn(3, 5).to(dtype)]
    clean = int(fingerprint(params))
    bits = params[0].element_size() * 8
    for bit in range(bits):
        flipped = [p.clone() for p in params]
        raw = flipped[0].view(torch.uint8)
        raw[bit // 8] ^= 1 << (bit % 8)
        assert int(fingerprint(flipped)) != clean, bit
    assert int(fingerprint([p.clone() for p in params])) == clean


def test_the_majority_names_the_replica_that_disagrees() -> None:
    # 2 model-parallel slots, 3 replicas each: ranks 0, 2, 4 hold slot 0; 1, 3, 5 slot 1
    assert replica_splits([7, 9, 7, 9, 7, 9], 2) == []
    assert replica_splits([7, 9, 8, 9, 7, 9], 2) == [
        schemas.ReplicaSplit(slot=0, groups=[[0, 4], [2]])
    ]
    # two replicas cannot out-vote each other: the lower rank's group comes first, size-tied
    assert replica_splits([1, 2], 1) == [schemas.ReplicaSplit(slot=0, groups=[[0], [1]])]


def test_a_window_is_read_once_with_non_finite_steps_counted_not_summed() -> None:
    published: list[schemas.Event] = []
    monitor = NumericsMonitor(read_every=4, fingerprint_every=8, publish=published.append)
    losses = [2.0, float("inf"), 4.0, 6.0, 1.0, 1.0, 1.0, 1.0]
    readings = [monitor.observe(step, torch.tensor(v), 1.5) for step, v in enumerate(losses, 1)]
    assert [r is None for r in readings] == [True, True, True, False] * 2
    first = readings[3]
    assert first is not None
    assert (first.loss_mean, first.loss_max, first.nonfinite_steps) == (4.0, 6.0, 1)
    assert first.grad_norm_mean == 1.5 and first.fingerprint is None
    (event, _) = published
    assert isinstance(event, schemas.Numerics) and event.step == 4 and event.fingerprint_step == -1
    assert schemas.decode_event(schemas.encode(event)) == event


def run_replicas(*backend_device: str) -> list[dict]:
    """Each of 3 rank processes' outcome: ``{"value": readings}`` or the error
    (tests/shim/numerics_rank.py)."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    argv = [sys.executable, "-m", "tests.shim.numerics_rank"]
    processes = [
        subprocess.Popen(
            [*argv, str(rank), "3", "1", "2", *backend_device],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
        )
        for rank in range(3)
    ]
    outputs = [p.communicate(timeout=240)[0] for p in processes]
    assert [p.returncode for p in processes] == [0, 0, 0]
    return [json.loads(out.decode().strip().splitlines()[-1]) for out in outputs]


def test_replicas_compared_over_a_real_gloo_group() -> None:
    """3 data-parallel replicas, one bit flipped on rank 1 after step 7, a NaN loss on rank 2
    at step 3: the window to step 5 counts the NaN and agrees; the windows to steps 10 and 15
    name rank 1 against the majority of ranks 0 and 2, on every rank."""
    assert_flip_and_nan_found(run_replicas())


def test_an_nccl_like_group_gets_cuda_tensors_only() -> None:
    """On a group serving CUDA alone (the named fake, as NCCL), the window's reductions reach
    for the rank's CUDA device; none offers a CPU tensor (on this CPU-only torch, torch.cuda
    refuses to make one: the error comes from there, not from dispatch refusing a CPU one)."""
    for outcome in run_replicas(fake_nccl.NAME, "cpu"):
        if torch.cuda.is_available():
            assert "value" in outcome, outcome
            continue
        assert DISPATCH_REFUSAL not in outcome["error"], outcome
        assert "torch/cuda" in outcome["raised_in"].replace(os.sep, "/"), outcome


def assert_flip_and_nan_found(outcomes: list[dict]) -> None:
    per_rank = [outcome["value"]["readings"] for outcome in outcomes]
    assert per_rank[0] == per_rank[1] == per_rank[2]
    # known clean on every rank: nothing after the NaN's window; without it, the step before
    # the window to step 5, where the replicas last agreed
    assert [outcome["value"]["clean"] for outcome in outcomes] == [[]] * 3
    assert [outcome["value"]["clean_without_nan"] for outcome in outcomes] == [[0]] * 3
    first, second, third = per_rank[0]
    assert first["nonfinite_steps"] == 1 and first["fingerprint"] is not None
    # steps 1-5 on ranks 0-2: losses 1 + step + rank, less rank 2's NaN at step 3
    finite = [1 + s + r for s in range(1, 6) for r in range(3) if (s, r) != (3, 2)]
    assert first["loss_mean"] == pytest.approx(sum(finite) / len(finite))
    assert first["loss_max"] == 8.0
    for later in (second, third):
        assert later["fingerprint"] is None and later["nonfinite_steps"] == 0
        assert later["splits"] == [{"slot": 0, "groups": [[0, 2], [1]]}]


def test_a_step_is_known_clean_where_replicas_agreed_and_nothing_suspect_came_since() -> None:
    """One process (its own replica): every fingerprint agrees, and the claim is the step
    before that fingerprint's window (a loss spike in the window is the supervisor's to find,
    and its rollback goes before the window). A non-finite window stops the claims until a
    restore (a rollback goes back before it); a window without a fingerprint, or a monitor
    given no parameters, claims nothing."""
    clean: list[int] = []
    monitor = NumericsMonitor(read_every=2, fingerprint_every=4, on_clean=clean.append)
    params = [torch.ones(3)]
    for step in range(1, 9):
        monitor.observe(step, 1.0, 0.5, lambda: params)
    assert clean == [2, 6]  # fingerprints at 4 and 8, each window 2 steps long
    monitor.observe(9, float("nan"), 0.5, lambda: params)
    for step in range(10, 17):
        monitor.observe(step, 1.0, 0.5, lambda: params)
    assert clean == [2, 6]  # 12 and 16 agreed, but after the NaN
    monitor.reset()
    for step in range(9, 13):
        monitor.observe(step, 1.0, 0.5, lambda: params)
    assert clean == [2, 6, 10]
    for step in range(13, 17):
        monitor.observe(step, 1.0, 0.5, None)
    assert clean == [2, 6, 10]


def test_a_window_begun_mid_way_counts_only_its_steps() -> None:
    """Resumed at step 7, the window ending at step 10 holds steps 8-10: a fault in it is not
    placed before the restore."""
    monitor = NumericsMonitor(read_every=10, fingerprint_every=10)
    readings = [monitor.observe(step, 1.0) for step in (8, 9, 10)]
    assert readings[-1] is not None and readings[-1].steps == 3


def test_sharded_parameters_are_left_out_of_the_fingerprint() -> None:
    """A DTensor's shard differs from rank to rank by design: only replicated parameters are
    compared."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        plain = torch.randn(8)
        sharded = distribute_tensor(torch.randn(8, 4), mesh, [Shard(0)])
        assert int(fingerprint([plain, sharded])) == int(fingerprint([plain]))
    finally:
        dist.destroy_process_group()


def test_hsdp_replicas_are_compared_shard_by_shard() -> None:
    """HSDP, 2 replicas x 2 shards over 4 real gloo ranks: the ranks holding the same shard
    are compared (slot = the shard), a bit flipped in rank 3's shard after step 7 splits
    shard 1's replicas at step 10 (two replicas: no majority, both named), and the step
    before the window of step 5, where they agreed, is the last known clean."""
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.shim.hsdp_numerics_rank", str(rank), "3"],
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
        )
        for rank in range(4)
    ]
    outputs = [p.communicate(timeout=240)[0] for p in processes]
    assert [p.returncode for p in processes] == [0, 0, 0, 0]
    for out in outputs:
        outcome = json.loads(out.decode().strip().splitlines()[-1])
        first, split, after = outcome["readings"]
        assert first["fingerprint"] is not None and not first["splits"]
        assert split["fingerprint"] is None
        assert split["splits"] == after["splits"] == [{"slot": 1, "groups": [[1], [3]]}]
        assert outcome["clean"] == [0]


def test_parameters_under_a_sharding_wrapper_are_not_compared() -> None:
    """FSDP1's flat parameters and ZeRO's partitions are shards: nothing of them is handed
    to the fingerprint (a real FSDP1 wrapper on a one-rank gloo group)."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel

    from goodput.shim.numerics import replicated

    plain = torch.nn.Sequential(torch.nn.Linear(2, 2))
    get = replicated(plain)
    assert get is not None and len(get()) == 2
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        wrapped = FullyShardedDataParallel(
            torch.nn.Sequential(torch.nn.Linear(2, 2)), device_id=torch.device("cpu")
        )
        get = replicated(wrapped)
        assert get is not None and get() == []
    finally:
        dist.destroy_process_group()
    partitioned = torch.nn.Linear(2, 2)
    partitioned.weight.ds_id = 7  # type: ignore[attr-defined]  # as DeepSpeed marks its own
    get = replicated(partitioned)
    assert get is not None and [p.shape for p in get()] == [torch.Size([2])]
    assert replicated(None) is None
