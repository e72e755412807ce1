"""The checkpoint engine with CUDA state: pinned host buffers, the copy on a side stream, the
D2H copy overlapped with the next forward/backward, and bit-exact restores."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

from goodput.checkpoint.engine import CheckpointEngine
from goodput.checkpoint.engine.buffers import HostBuffer
from tests.ckpt.helpers import assert_bit_exact, make_state
from tests.gpu.kit import GPU

pytestmark = GPU


def _map(value: Any, move: Any) -> Any:
    """``value`` with every tensor replaced by ``move(tensor)``, the structure kept."""
    if isinstance(value, torch.Tensor):
        return move(value)
    if isinstance(value, dict):
        return type(value)((key, _map(item, move)) for key, item in value.items())
    if isinstance(value, list | tuple):
        return type(value)(_map(item, move) for item in value)
    return value


def _cpu(value: Any) -> Any:
    return _map(value, lambda t: t.detach().cpu())


def _cuda_state(seed: int) -> dict[str, Any]:
    """A training-like state whose model and optimizer live on the GPU (RNG states and plain
    values stay on the host, as in a real checkpoint), with a non-contiguous CUDA view."""
    state = make_state(seed, scale=8)
    state["model"] = _map(state["model"], lambda t: t.cuda())
    state["optim"] = _map(state["optim"], lambda t: t.cuda())
    state["model"]["transposed"] = torch.randn(96, 40, device="cuda").t()
    return state


def test_host_buffers_for_cuda_state_are_page_locked() -> None:
    """``cudaHostRegister`` succeeds on the aligned buffer (``Tensor.is_pinned`` cannot say:
    it asks about the storage's start, before the aligned, registered range)."""
    buffer = HostBuffer(1 << 20, pin=True)
    try:
        assert buffer.pinned
        source = torch.arange(1 << 18, dtype=torch.int32, device="cuda")
        target = buffer.data[: source.numel() * 4].view(torch.int32)
        target.copy_(source, non_blocking=True)
        torch.cuda.current_stream().synchronize()
        assert torch.equal(target, source.cpu())
    finally:
        buffer.release()
    assert not buffer.pinned


def test_cuda_state_restores_bit_exact_from_disk_and_into_gpu_tensors(tmp_path: Path) -> None:
    state = _cuda_state(3)
    expected = _cpu(state)
    with CheckpointEngine(tmp_path) as engine:
        result = engine.save(state, 7).wait()
        assert result.ok, result.error
        assert engine.host_snapshot(7) is not None  # the host tier holds the GPU's bytes
        _, restored = engine.restore()
        assert_bit_exact(expected, _cpu(restored))
        template = _map(state, torch.zeros_like)
        _, into = engine.restore(into=template)
    assert into is template and into["model"]["layer0.weight"].is_cuda  # filled in place
    assert_bit_exact(expected, _cpu(into))


def test_overlapped_d2h_copy_holds_the_state_of_the_save_through_the_next_step(
    tmp_path: Path,
) -> None:
    """``save(overlap=True)`` returns before the copy; the next forward/backward runs while the
    side stream copies; the optimizer step (guarded) then changes every tensor in place.
    The checkpoint must hold the state at the save, bit for bit."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(8)]).cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    batch = torch.randn(64, 2048, device="cuda")
    model(batch).sum().backward()
    optimizer.step()
    with CheckpointEngine(tmp_path) as engine:
        engine.guard(optimizer)
        state = {"model": model.state_dict(), "optim": optimizer.state_dict()}
        at_save = _cpu(copy.deepcopy(state))
        handle = engine.save(state, 1, overlap=True)
        model(batch).sum().backward()  # runs while the copy may still read the state
        optimizer.step()  # the guard orders it after the copy on the GPU
        assert handle.copy is not None and handle.copy.events, "the copy ran on a CUDA stream"
        assert not torch.equal(model[0].weight.cpu(), at_save["model"]["0.weight"])
        result = handle.wait()
        assert result.ok, result.error
        _, restored = engine.restore()
    assert_bit_exact(at_save, _cpu(restored))


def test_an_overlapped_save_waits_for_a_training_loop_on_its_own_stream(tmp_path: Path) -> None:
    """A loop that trains on a non-default stream queues its last writes there, then saves:
    the copy, launched later on the engine's planner thread (whose current stream is another),
    must still wait for them. Long matmuls ahead of the final fill leave a copy that waits only
    on the default stream reading the old values."""
    stream = torch.cuda.Stream()
    weights = torch.zeros(4096, 4096, device="cuda")
    work = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()
    with CheckpointEngine(tmp_path) as engine, torch.cuda.stream(stream):
        for _ in range(20):
            work = work @ work / 4096  # keeps the stream busy well past the save's return
        weights.fill_(7.0)
        handle = engine.save({"w": weights}, 1, overlap=True)
        result = handle.wait()
        assert result.ok, result.error
        _, restored = engine.restore()
    assert torch.equal(restored["w"], torch.full((4096, 4096), 7.0))
