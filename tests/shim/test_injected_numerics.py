"""The shim's injected numerical faults ("nan", "loss-spike", "sdc"): applied once, at the next
step boundary, only where fault injection is on and the command targets this rank."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from goodput import schemas
from goodput.shim.injected_faults import RANK_FAULT_KINDS, SDC_ELEMENT, flip_bit, sdc_bit
from goodput.shim.numerics import fingerprint
from goodput.shim.trainer import ShimConfig, TrainerShim


def shim(tmp_path: Path, injectable: bool = True) -> TrainerShim:
    config = ShimConfig(
        job="j",
        node="node-1",
        rank=1,
        ckpt_dir=str(tmp_path),
        enable_fault_injection=injectable,
        numerics_every=2,
        fingerprint_every=2,
    )
    return TrainerShim(config, install_signal_handlers=False)


def inject(fault: str, **fields) -> schemas.InjectFault:
    return schemas.InjectFault(job="j", node="node-1", fault=fault, **fields)


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(4, 3), torch.nn.Linear(3, 2))


def test_the_numerical_faults_are_in_the_one_list_of_rank_faults() -> None:
    assert set(RANK_FAULT_KINDS) == {"hang", "slow", "nan", "sdc", "loss-spike"}


@pytest.mark.parametrize(
    ("dtype", "bit"),
    [(torch.float32, 22), (torch.bfloat16, 6), (torch.float16, 9), (torch.float64, 51)],
)
def test_sdc_flips_the_top_mantissa_bit(dtype: torch.dtype, bit: int) -> None:
    assert sdc_bit(dtype) == bit


def test_sdc_flips_one_bit_of_the_first_parameter_once(tmp_path: Path) -> None:
    trainer, net = shim(tmp_path), model()
    parameters = lambda: list(net.parameters())  # noqa: E731
    before = [p.detach().clone() for p in net.parameters()]
    trainer._on_command(inject("sdc"))  # the whole node: no rank named
    assert trainer.numerics.observe(1, 1.0, None, parameters) is None
    after = list(net.parameters())
    flipped = before[0].view(-1).view(torch.int32) ^ after[0].detach().view(-1).view(torch.int32)
    assert flipped[SDC_ELEMENT].item() == 1 << 22 and int(flipped.count_nonzero()) == 1
    assert all(torch.equal(b, a) for b, a in zip(before[1:], after[1:], strict=True))
    assert math.isfinite(after[0].view(-1)[SDC_ELEMENT].item())
    # applied once: the next step leaves the parameters alone; the fingerprint saw the flip
    now = after[0].detach().clone()
    reading = trainer.numerics.observe(2, 1.0, None, parameters)
    assert torch.equal(now, after[0]) and reading is not None
    assert reading.fingerprint == int(fingerprint(after))
    assert reading.fingerprint != int(fingerprint(before))


def test_sdc_flips_a_bit_of_a_sharded_parameters_local_shard() -> None:
    """Under FSDP2/HSDP the parameters are DTensors: the bit flips in this rank's shard."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        sharded = distribute_tensor(torch.ones(4, 2), init_device_mesh("cpu", (1,)), [Shard(0)])
        before = sharded.to_local().clone()
        assert "parameter 0 (torch.float32)" in flip_bit([sharded])
        flipped = before.view(-1).view(torch.int32) ^ sharded.to_local().view(-1).view(torch.int32)
        assert flipped[SDC_ELEMENT].item() == 1 << 22 and int(flipped.count_nonzero()) == 1
    finally:
        dist.destroy_process_group()


def test_nan_and_loss_spike_change_the_next_loss_the_monitor_sees(tmp_path: Path) -> None:
    trainer = shim(tmp_path)
    trainer._on_command(inject("nan", detail="1"))
    trainer.numerics.observe(1, torch.tensor(2.0))
    reading = trainer.numerics.observe(2, torch.tensor(2.0))
    assert reading is not None and reading.nonfinite_steps == 1 and reading.loss_mean == 2.0
    trainer._on_command(inject("loss-spike", detail="1", factor=50.0))
    trainer.numerics.observe(3, 2.0)
    reading = trainer.numerics.observe(4, 2.0)
    assert reading is not None and (reading.loss_max, reading.nonfinite_steps) == (100.0, 0)
    # a spike without a factor is the default 10×
    trainer._on_command(inject("loss-spike"))
    trainer.numerics.observe(5, 2.0)
    assert trainer.numerics.observe(6, 2.0).loss_max == 20.0  # type: ignore[union-attr]


def test_faults_for_another_rank_or_cleared_or_without_injection_are_not_applied(
    tmp_path: Path,
) -> None:
    trainer = shim(tmp_path)
    trainer._on_command(inject("nan", detail="0"))  # rank 0's
    trainer._on_command(schemas.InjectFault(job="j", node="node-0", fault="nan"))
    trainer._on_command(inject("loss-spike", factor=5.0))
    trainer._on_command(inject("loss-spike", clear=True))
    trainer._on_command(inject("bogus"))  # no rank fault by that name
    trainer.numerics.observe(1, 1.0)
    reading = trainer.numerics.observe(2, 1.0)
    assert reading is not None and (reading.nonfinite_steps, reading.loss_max) == (0, 1.0)
    refusing, net = shim(tmp_path, injectable=False), model()
    before = [p.detach().clone() for p in net.parameters()]
    refusing._on_command(inject("sdc"))
    refusing._on_command(inject("nan"))
    refusing.numerics.observe(1, 1.0, None, lambda: list(net.parameters()))
    reading = refusing.numerics.observe(2, 1.0, None, lambda: list(net.parameters()))
    assert reading is not None and reading.nonfinite_steps == 0
    assert all(torch.equal(b, a) for b, a in zip(before, net.parameters(), strict=True))
