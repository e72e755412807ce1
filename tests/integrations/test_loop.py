"""SupervisedLoop in this process (no bus): resume is bit-identical, misuse is named."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from goodput.integrations.loop import SupervisedLoop
from goodput.shim import ShimConfig, TrainerShim
from tests.integrations.harness import assert_identical


def train(
    directory: Path, total_steps: int, stop_after: int | None = None, overlap: bool = False
) -> SupervisedLoop:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    shim = TrainerShim(
        ShimConfig(ckpt_dir=str(directory), ckpt_every=4), install_signal_handlers=False
    )
    loop = SupervisedLoop(
        shim=shim,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        overlap_saves=overlap,
    )
    for step in loop.steps(total_steps):
        inputs = torch.randn(16, 4)  # the global RNG: its state is checkpointed too
        loss = torch.nn.functional.mse_loss(model(inputs), inputs.sum(dim=1, keepdim=True))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()
        loop.step_done(loss, tokens=16)
        if step == stop_after:
            break  # leaving the loop saves where it is
    return loop


@pytest.mark.parametrize("overlap", [False, True], ids=["blocking-saves", "overlapped-saves"])
def test_a_stopped_loop_resumes_bit_identically(tmp_path: Path, overlap: bool) -> None:
    """Overlapped: every save's copy runs on into the next step, whose optimizer step waits
    for it; what is restored is still the state at the save."""
    reference = train(tmp_path / "reference", 10)
    first = train(tmp_path / "resumed", 10, stop_after=6, overlap=overlap)
    assert first.step == 6 and first.restored is None
    resumed = train(tmp_path / "resumed", 10, overlap=overlap)
    assert resumed.restored is not None and resumed.restored.step == 6
    assert resumed.step == reference.step == 10
    assert_identical(resumed.state(), reference.state())


def test_a_step_without_step_done_is_refused(tmp_path: Path) -> None:
    shim = TrainerShim(ShimConfig(ckpt_dir=str(tmp_path)), install_signal_handlers=False)
    loop = SupervisedLoop(shim=shim, model=torch.nn.Linear(2, 1))
    with pytest.raises(RuntimeError, match="step_done"):
        for _ in loop.steps(3):
            pass


def test_overlapped_saves_need_an_optimizer_to_guard(tmp_path: Path) -> None:
    shim = TrainerShim(ShimConfig(ckpt_dir=str(tmp_path)), install_signal_handlers=False)
    with pytest.raises(ValueError, match="optimizer"):
        SupervisedLoop(shim=shim, overlap_saves=True, model=torch.nn.Linear(2, 1))


def test_the_rng_name_is_reserved(tmp_path: Path) -> None:
    shim = TrainerShim(ShimConfig(ckpt_dir=str(tmp_path)), install_signal_handlers=False)
    with pytest.raises(ValueError, match="rng"):
        SupervisedLoop(shim=shim, rng=torch.nn.Linear(2, 1))
