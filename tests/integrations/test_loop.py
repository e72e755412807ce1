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


def test_the_loop_reports_numerics_once_a_window(tmp_path: Path) -> None:
    """Loss and gradient norm reach a Numerics event every ``numerics_every`` steps, the
    model's fingerprint every ``fingerprint_every``; the step events carry the newest loss
    read (no step waits for the device)."""
    from goodput import schemas
    from goodput.shim.numerics import fingerprint

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    shim = TrainerShim(
        ShimConfig(ckpt_dir=str(tmp_path), ckpt_every=100, numerics_every=3, fingerprint_every=6),
        install_signal_handlers=False,
    )
    published: list[schemas.Event] = []
    shim.numerics.publish = published.append
    loop = SupervisedLoop(shim=shim, model=model, optimizer=optimizer)
    losses, norms, prints = [], [], {}
    for step in loop.steps(6):
        inputs = torch.randn(8, 4)
        loss = torch.nn.functional.mse_loss(model(inputs), inputs.sum(dim=1, keepdim=True))
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
        norms.append(float(norm))
        prints[step] = int(fingerprint(model.parameters()))
        loop.step_done(loss, tokens=8, grad_norm=norm)
    first, second = published
    assert isinstance(first, schemas.Numerics) and isinstance(second, schemas.Numerics)
    assert (first.step, first.steps, first.fingerprint_step) == (3, 3, -1)
    assert first.loss_mean == pytest.approx(sum(losses[:3]) / 3)
    assert first.loss_max == pytest.approx(max(losses[:3]))
    assert first.grad_norm_mean == pytest.approx(sum(norms[:3]) / 3)
    assert (second.step, second.fingerprint_step, second.fingerprint) == (6, 6, prints[6])
    assert shim.numerics.last_loss == pytest.approx(sum(losses[3:]) / 3)


def _train_corruptible(
    directory: Path, total_steps: int, *, corrupt_at: int | None = None, before: int | None = None
) -> SupervisedLoop:
    """``train``'s job; ``corrupt_at``: one bit of one weight flips after that step (a silent
    data corruption); ``before``: launched as a numerical rollback's attempt."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    # three kept: the volume still holds step 4 beside the step 8 the rollback restores
    config = ShimConfig(
        ckpt_dir=str(directory), ckpt_every=4, keep_last=3, restore_before_step=before
    )
    loop = SupervisedLoop(
        shim=TrainerShim(config, install_signal_handlers=False), model=model, optimizer=optimizer
    )
    for step in loop.steps(total_steps):
        inputs = torch.randn(16, 4)
        loss = torch.nn.functional.mse_loss(model(inputs), inputs.sum(dim=1, keepdim=True))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step == corrupt_at:
            with torch.no_grad():
                model[0].weight.view(-1).view(torch.int32)[3] ^= 1 << 22
        loop.step_done(loss, tokens=16)
        # each save durable before the next: the engine drops a snapshot still waiting when
        # a newer one comes (newest wins), and this test needs steps 4 and 8 on the volume
        loop.shim.engine.wait_until_idle()
    return loop


def test_a_rollback_restores_before_the_fault_and_ends_bit_identical(tmp_path: Path) -> None:
    """A bit flipped after step 9 is in the step-12 checkpoint. Relaunched to restore before
    step 10 (the first step the fault may have touched), the job resumes from step 8, drops
    the step-12 checkpoint (a later restart must not resume from it) and ends as the run
    that was never corrupted did."""
    from goodput.checkpoint.format.layout import step_dirs

    reference = _train_corruptible(tmp_path / "reference", 12)
    corrupted = _train_corruptible(tmp_path / "run", 12, corrupt_at=9)
    with pytest.raises(AssertionError):
        assert_identical(corrupted.state(), reference.state())
    assert [step for step, _ in step_dirs(tmp_path / "run")] == [12, 8, 4]
    rolled_back = _train_corruptible(tmp_path / "run", 12, before=10)
    assert rolled_back.restored is not None and rolled_back.restored.step == 8
    assert rolled_back.step == 12
    assert_identical(rolled_back.state(), reference.state())
