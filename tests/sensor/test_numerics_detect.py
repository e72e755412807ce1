"""Numerical faults judged from the trainer's Numerics windows (pure; the clock passed in)."""

from __future__ import annotations

import math
import random

import msgspec
import pytest

from goodput import schemas
from goodput.supervisor.detect.detector import Detector
from goodput.supervisor.detect.numerics import NumericsJudge, SpikeRule

JOB = "numerics"
NODES = {0: "n0", 1: "n1", 2: "n2"}


def window(step: int, loss_max: float, **fields: object) -> schemas.Numerics:
    return schemas.Numerics(
        job=JOB,
        ts=1_700_000_000 * 10**9 + step * 10**8,
        node="n0",
        rank=0,
        step=step,
        steps=10,
        loss_mean=loss_max * 0.9,
        loss_max=loss_max,
        **fields,  # type: ignore[arg-type]
    )


def clean_losses(steps: int, seed: int) -> list[float]:
    """A falling loss with per-step noise (5 % log-normal, an occasional 20 % hard batch)."""
    rng = random.Random(seed)
    losses = []
    for step in range(1, steps + 1):
        trend = 2.0 + 8.0 * math.exp(-step / 2000)
        hard = 1.2 if rng.random() < 0.01 else 1.0
        losses.append(trend * hard * math.exp(rng.gauss(0, 0.05)))
    return losses


def test_a_non_finite_window_is_found_with_its_first_step() -> None:
    judge = NumericsJudge()
    (finding,) = judge.observe(window(40, 2.0, nonfinite_steps=2), NODES)
    assert finding.kind == "nonfinite" and finding.first_bad_step == 31
    assert "2 of steps 31-40" in finding.reason


@pytest.mark.parametrize("seed", range(3))
def test_ten_thousand_clean_steps_raise_nothing(seed: int) -> None:
    """10,000 steps of a falling, noisy loss (synthetic, seeded; not the example job's own
    losses): no window is judged a spike."""
    judge = NumericsJudge()
    losses = clean_losses(10_000, seed)
    for end in range(10, 10_001, 10):
        assert judge.observe(window(end, max(losses[end - 10 : end])), NODES) == [], end


def test_a_poisoned_batch_is_a_spike_and_stays_out_of_the_history() -> None:
    judge = NumericsJudge(SpikeRule(window=20, min_windows=5))
    losses = clean_losses(300, 7)
    for end in range(10, 301, 10):
        assert judge.observe(window(end, max(losses[end - 10 : end])), NODES) == []
    (spike,) = judge.observe(window(310, 3 * losses[-1]), NODES)
    assert spike.kind == "loss_spike" and spike.first_bad_step == 301
    assert "over the median" in spike.reason and "MAD" in spike.reason
    # the spike did not widen what counts as normal: the same spike is found again
    assert [f.kind for f in judge.observe(window(320, 3 * losses[-1]), NODES)] == ["loss_spike"]


def test_a_job_restored_from_an_early_step_is_judged_against_that_timeline() -> None:
    """A spare restored from step 20 of a job at step 1,500 (the newest checkpoint every part
    of was that old): step 21's loss is step 21's, not a spike over step 1,500's."""
    judge = NumericsJudge()
    losses = clean_losses(1_500, 3)
    for end in range(10, 1_501, 10):
        agreed = {"fingerprint_step": end, "fingerprint": 5} if end == 100 else {}
        assert judge.observe(window(end, max(losses[end - 10 : end]), **agreed), NODES) == []
    assert judge.last_agreed_step == 100
    for end in range(30, 301, 10):  # the same steps again, from step 20 on
        assert judge.observe(window(end, max(losses[end - 10 : end])), NODES) == [], end
    # what it learnt of the abandoned steps went with them: step 100's agreement too
    assert judge.last_agreed_step == -1
    split = [schemas.ReplicaSplit(slot=0, groups=[[0, 2], [1]])]
    (mismatch,) = judge.observe(window(310, 2.0, fingerprint_step=310, splits=split), NODES)
    assert mismatch.first_bad_step == 0
    # and a spike of this timeline is still one
    (spike,) = judge.observe(window(320, 3 * losses[300]), NODES)
    assert spike.kind == "loss_spike" and spike.first_bad_step == 311


def test_nothing_is_judged_during_warm_up() -> None:
    judge = NumericsJudge(SpikeRule(window=20, min_windows=5))
    for end in range(10, 51, 10):
        assert judge.observe(window(end, 10.0 if end == 50 else 2.0), NODES) == []


def test_the_judge_says_when_its_warm_up_is_behind_in_the_current_timeline() -> None:
    """`goodput bench detect` waits on this before its spike: a job restored from step 25
    (windows 30-250 forgotten) that then jumps to a newer checkpoint (step 257) has 4 windows
    behind it, not 27 (bench run of 2026-11-29: the spike went unjudged)."""
    judge = NumericsJudge(SpikeRule(window=20, min_windows=5))
    for end in range(10, 41, 10):
        judge.observe(window(end, 2.0), NODES)
        assert not judge.judging_spikes
    judge.observe(window(50, 2.0), NODES)
    assert judge.judging_spikes  # the next window is judged
    (spike,) = judge.observe(window(60, 10.0), NODES)
    assert spike.kind == "loss_spike"
    judge.observe(msgspec.structs.replace(window(30, 2.0), steps=5), NODES)  # back to step 25
    assert not judge.judging_spikes
    judge.observe(msgspec.structs.replace(window(260, 2.0), steps=3), NODES)  # on to 257
    assert not judge.judging_spikes
    assert judge.observe(window(270, 10.0), NODES) == []  # not judged: 4 windows behind it


def test_the_majority_names_the_corrupt_replica_and_a_repeat_is_uncorrectable() -> None:
    judge = NumericsJudge()
    assert judge.observe(window(100, 2.0, fingerprint_step=100, fingerprint=5), NODES) == []
    assert judge.last_agreed_step == 100
    split = [schemas.ReplicaSplit(slot=0, groups=[[0, 2], [1]])]
    (first,) = judge.observe(window(200, 2.0, fingerprint_step=200, splits=split), NODES)
    assert (first.kind, first.rank, first.node, first.severity) == (
        "replica_mismatch",
        1,
        "n1",
        "correctable",
    )
    assert first.first_bad_step == 101  # after the last step every replica agreed on
    assert "[0, 2] agree" in first.reason
    (again,) = judge.observe(window(300, 2.0, fingerprint_step=300, splits=split), NODES)
    assert again.severity == "uncorrectable" and "repeat offender" in again.reason


def test_without_a_majority_no_replica_is_named_nor_counted_an_offender() -> None:
    """Two replicas that disagree: either may be the corrupt one. The finding names no rank
    or node (a rollback for the job) and a second split is no repeat offence of anyone's:
    blaming one would quarantine a sound node half the time."""
    judge = NumericsJudge()
    split = [schemas.ReplicaSplit(slot=0, groups=[[0], [1]])]
    for step in (100, 200):
        (finding,) = judge.observe(window(step, 2.0, fingerprint_step=step, splits=split), NODES)
        assert (finding.rank, finding.node, finding.severity) == (None, "", "correctable")
        assert "no majority" in finding.reason and "none can be named" in finding.reason


def test_the_detector_signals_a_numerical_fault_with_its_window() -> None:
    detector = Detector(JOB)
    now = 1_700_000_000 * 10**9
    for rank, node in NODES.items():
        started = schemas.RankStarted(
            job=JOB, ts=now, node=node, rank=rank, local_rank=0, world_size=3, pid=10 + rank
        )
        detector.on_event(started, now)
    split = [schemas.ReplicaSplit(slot=0, groups=[[0, 2], [1]])]
    (signal,) = detector.on_event(window(200, 2.0, fingerprint_step=200, splits=split), now + 1)
    assert (signal.signal, signal.node, signal.rank) == ("replica_mismatch", "n1", 1)
    assert signal.first_bad_step == 0 and signal.severity == "correctable"
    (nan,) = Detector(JOB).on_event(window(50, 2.0, nonfinite_steps=1), now)
    assert nan.signal == "nonfinite" and nan.first_bad_step == 41 and nan.node == ""
    assert nan.last_bad_step == 50  # the window it was seen in ends there
