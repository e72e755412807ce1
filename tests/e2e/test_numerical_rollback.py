"""Numerical faults injected by `goodput chaos` into the real example job on the real stack:
a bit flipped in one of 3 data-parallel replicas (SDC), a NaN loss and a loss spike are each
found and rolled back, the spike's window of batches skipped, and the job ends bit-identical
to an uninterrupted run that skipped the same batches (issue 39).

The replicas are compared every 50 steps while a node keeps only its newest checkpoints (one
every 5 steps; the engine keeps 3, the replicator's GC 2, every second, neither waiting for a
peer's copy): the clean checkpoint a rollback needs is out of that span by the time a fault
is found, and only its protection (``checkpoint/format/clean_record.py``) keeps it on the
volumes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from goodput import schemas
from goodput.checkpoint.index.retention import DEFAULT_KEEP
from goodput.launch.rank_env import knobs
from goodput.tools.chaos import ChaosContext, fire
from goodput.tools.chaos import spec as faults
from tests.examples.launch import TINY_MODEL_ARGS, Launcher, read_result
from tests.stack.helpers import EventTap, job_on_stack

pytestmark = pytest.mark.slow
JOB = "job-num"
STEPS = 150
#: a window every 5 steps, the replicas compared every 50, a checkpoint every 5: the newest
#: DEFAULT_KEEP["local"] checkpoints span 10 steps, far less than the fingerprint period
FINGERPRINT_EVERY = 50
NUMERICS_EVERY = 5
CKPT_EVERY = 5
ENV = knobs(
    enable_fault_injection=True,
    ckpt_every=CKPT_EVERY,
    numerics_every=NUMERICS_EVERY,
    fingerprint_every=FINGERPRINT_EVERY,
)
#: the job keeps its interval (Young's, hundreds of steps for this job, would leave nothing
#: for retention to delete), and both deleters delete as soon as the rule lets them: a peer's
#: copy lags by seconds here, and the guard waiting for one would keep every step meanwhile
EAGER_RETENTION = (
    *("--service-set", "controller:settings={checkpoint_interval={enabled=false}}"),
    *("--service-set", "replicator:gc_require=[]"),
    *("--service-set", "replicator:gc_interval_s=1"),
)


def _running(attempt: int):
    return lambda e: (
        isinstance(e, schemas.JobStatus) and e.attempt == attempt and e.state == "running"
    )


async def _step_reached(tap: EventTap, step: int, after_ts: int) -> schemas.StepDone:
    return await tap.wait_for(  # type: ignore[return-value]
        lambda e: isinstance(e, schemas.StepDone) and e.step >= step,
        timeout_s=240,
        what=f"step {step}",
        after_ts=after_ts,
    )


async def _rolled_back(tap: EventTap, kind: str) -> tuple[schemas.Signal, schemas.Decision]:
    signal = await tap.wait_for(
        lambda e: isinstance(e, schemas.Signal) and e.signal == kind,
        timeout_s=120,
        what=f"{kind} signal",
    )
    decision = await tap.wait_for(
        lambda e: isinstance(e, schemas.Decision) and e.signal_id == signal.signal_id
    )
    return signal, decision  # type: ignore[return-value]


async def test_an_sdc_a_nan_and_a_spike_are_rolled_back_and_the_job_ends_bit_identical(
    tmp_path: Path,
) -> None:
    result = tmp_path / "result.json"
    argv = ["--steps", str(STEPS), "--result", str(result), *TINY_MODEL_ARGS]
    start = schemas.StartJob(
        job=JOB,
        argv=[sys.executable, "-m", "goodput.examples.gpt.supervised", *argv],
        nodes=3,
        procs_per_node=1,
        spares=0,
        env=ENV,
    )
    state = tmp_path / "stack"
    async with job_on_stack(state, JOB, 3, start, *EAGER_RETENTION) as (_, tap):
        ctx = ChaosContext.open(state)
        try:
            fired_at = await _step_reached(tap, FINGERPRINT_EVERY + 2, 0)
            sdc = await fire(faults.Sdc(node="node-1"), ctx)
            assert sdc.ok and "WARNING" not in sdc.detail, sdc.detail
            signal, decision = await _rolled_back(tap, "replica_mismatch")
            # found at the first fingerprint after the flip: the one before it agreed
            found = next(e for e in tap.of(schemas.Numerics) if e.splits and e.ts <= signal.ts)
            assert found.step > fired_at.step and found.step % FINGERPRINT_EVERY == 0
            assert found.splits[0].groups == [[0, 2], [1]], found.splits
            clean = found.step - FINGERPRINT_EVERY
            agreed = [e for e in tap.of(schemas.Numerics) if e.fingerprint_step == clean]
            assert agreed and agreed[0].fingerprint and not agreed[0].splits
            assert signal.node == "node-1" and signal.first_bad_step == clean + 1
            assert decision.rule == "numerical-rollback", decision
            # the ranks had saved more than retention keeps past the clean checkpoint...
            newer = {e.step for e in tap.of(schemas.CheckpointPersisted) if e.step > clean}
            assert len(newer) >= DEFAULT_KEEP["local"], newer
            back = await tap.wait_for(_running(2), timeout_s=180)
            # ...and every rank restored the one kept for it: the newest before the window of
            # the agreed fingerprint (the ranks' claim stops short of a window that may hold a
            # spike), the checkpoint at the fingerprint step itself long gone to retention
            kept = clean - NUMERICS_EVERY  # a multiple of CKPT_EVERY: a checkpoint is there
            for rank in range(3):
                restored = await tap.wait_for(
                    lambda e, r=rank: isinstance(e, schemas.CheckpointRestored) and e.rank == r,
                    timeout_s=120,
                    what=f"rank {rank}'s restore",
                    after_ts=decision.ts,
                )
                assert restored.step == kept, restored  # type: ignore[attr-defined]

            await _step_reached(tap, clean + 10, back.ts)
            nan = await fire(faults.NanLoss(rank=2), ctx)
            assert nan.ok, nan.detail
            signal, decision = await _rolled_back(tap, "nonfinite")
            assert decision.rule == "numerical-rollback", decision
            assert signal.first_bad_step % 5 == 1 and signal.first_bad_step > clean + 10
            back = await tap.wait_for(_running(3), timeout_s=180)

            await _step_reached(tap, 2 * FINGERPRINT_EVERY + 2, back.ts)
            spike = await fire(faults.LossSpike(rank=1, factor=10), ctx)
            assert spike.ok, spike.detail
            signal, decision = await _rolled_back(tap, "loss_spike")
            assert decision.rule == "numerical-rollback", decision
            assert signal.first_bad_step % 5 == 1 and signal.first_bad_step > 2 * FINGERPRINT_EVERY
            # a poisoned batch would spike again: the window's batches are skipped
            skipped = f"{signal.first_bad_step}-{signal.last_bad_step}"
            assert signal.last_bad_step == signal.first_bad_step + 4
            assert f"skip the batches of steps {skipped}" in decision.reason, decision
            finished = await tap.wait_for(
                lambda e: isinstance(e, schemas.JobStatus) and e.state == "finished",
                timeout_s=300,
            )
            assert finished.attempt == 4
            # every replica holds the same parameters at the end, the flipped one included
            last = [e for e in tap.of(schemas.Numerics) if e.fingerprint_step == STEPS][-1]
            assert last.fingerprint and not last.splits
        finally:
            await ctx.close()

    launcher = Launcher(tmp_path)
    reference = tmp_path / "reference.json"
    try:
        launcher.run(
            3,
            [
                *argv[:2],
                *("--ckpt-dir", str(tmp_path / "reference"), "--result", str(reference)),
                *("--skip-steps", skipped),  # what the spike's rollback skipped, from the start
                *TINY_MODEL_ARGS,
            ],
            timeout_s=300,
        )
    finally:
        launcher.close()
    rolled_back, uninterrupted = read_result(result), read_result(reference)
    assert rolled_back["steps"] == uninterrupted["steps"] == STEPS
    first, last = map(int, skipped.split("-"))
    # the rolled-back run differs from an uninterrupted one by exactly the skipped batches
    assert rolled_back["skipped_steps"] == uninterrupted["skipped_steps"]
    assert rolled_back["skipped_steps"] == list(range(first, last + 1))
    assert rolled_back["params_sha256"] == uninterrupted["params_sha256"]
