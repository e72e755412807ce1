"""A rank of a tiny loop on the trainer shim, with no bus: trains, then waits to be scraped.

``python -m tests.telemetry.prometheus_rank CKPT_DIR LOCAL_RANK`` trains :data:`STEPS` steps
of a linear model, saving every :data:`CKPT_EVERY`, prints ``trained`` and keeps its process
(and its metrics endpoint) until its stdin closes. The exporter comes from the ``OTEL_*``
variables the test sets, as for a rank the actuator launches.
"""

from __future__ import annotations

import sys
import time

import torch

from goodput.shim import ShimConfig, TrainerShim

STEPS, CKPT_EVERY = 6, 3


def main() -> None:
    ckpt_dir, local_rank = sys.argv[1], int(sys.argv[2])
    config = ShimConfig(
        ckpt_dir=ckpt_dir,
        ckpt_every=CKPT_EVERY,
        ckpt_mode="torch-save",
        local_rank=local_rank,
        job="metrics-job",
        node="n0",
    )
    shim = TrainerShim(config, install_signal_handlers=False)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(1, STEPS + 1):
        started = time.perf_counter()
        loss = model(torch.randn(8, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        shim.step_done(step, time.perf_counter() - started, tokens=8, loss=float(loss))
        if shim.should_checkpoint(step):
            shim.save({"model": model.state_dict()}, step)
    shim.finish({"model": model.state_dict()}, STEPS)
    print("trained", flush=True)
    sys.stdin.read()


if __name__ == "__main__":
    main()
