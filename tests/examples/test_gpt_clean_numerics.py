"""10,000 clean steps of the example job raise no numerical signal (issue 39).

The example job's own training (its data, model, AdamW, warm-up and cosine schedule, dropout,
gradient clipping), seeded, at a size that steps in ~2 ms on one core: a one-layer model and
the 12-sample global batch as one micro-batch. Each step goes through the shim's
``NumericsMonitor`` (the loss and gradient norm accumulated, read every 10 steps, a parameter
fingerprint every 100), and each window's ``Numerics`` event is judged by the sensor's
``NumericsJudge`` with its default rule. A small model's loss is noisier than a large one's,
which makes this a harder case for the spike rule, not an easier one.
"""

from __future__ import annotations

import msgspec
import pytest
import torch

from goodput import schemas
from goodput.examples.gpt.model import ModelConfig
from goodput.examples.gpt.training import TrainConfig, Trainer
from goodput.shim.numerics import NumericsMonitor
from goodput.shim.rescale import BatchPlan
from goodput.supervisor.detect.numerics import NumericsJudge

STEPS = 10_000
NODES = {0: "n0"}

pytestmark = pytest.mark.timeout(600)


def clean_windows(seed: int) -> list[schemas.Numerics]:
    config = TrainConfig(
        seed=seed,
        total_steps=STEPS,
        plan=BatchPlan(global_batch=12, micro_batch=12, lr=3e-3),
        model=ModelConfig(n_layer=1, n_head=2, d_model=32, seq_len=16),
    )
    trainer = Trainer(config)
    windows: list[schemas.Event] = []
    monitor = NumericsMonitor(
        read_every=10, fingerprint_every=100, publish=windows.append, job="clean", node="n0"
    )
    while trainer.step < STEPS:
        loss = trainer.train_step()
        monitor.observe(trainer.step, loss, trainer.last_grad_norm, trainer.model.parameters)
    return [w for w in windows if isinstance(w, schemas.Numerics)]


def test_ten_thousand_steps_of_the_example_job_raise_no_numerical_signal() -> None:
    torch.set_num_threads(1)
    windows = clean_windows(seed=0)
    assert len(windows) == STEPS // 10
    assert sum(w.fingerprint_step >= 0 for w in windows) == STEPS // 100

    judge = NumericsJudge()
    findings = [(w.step, f.reason) for w in windows for f in judge.observe(w, NODES)]
    assert findings == []
    # the rule was judging, not warming up, for all but its first windows
    assert judge.judging_spikes and judge.last_agreed_step == STEPS

    # and it is alive on this loss curve: the last window's loss tripled is a spike
    last = windows[-1]
    poisoned = msgspec.structs.replace(
        last, step=last.step + 10, loss_max=3 * last.loss_max, fingerprint_step=-1
    )
    assert [f.kind for f in judge.observe(poisoned, NODES)] == ["loss_spike"]
