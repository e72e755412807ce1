"""`goodput bench detect`'s numerical figures: the bounds it reports next to each latency, the
fingerprint's cost arithmetic, and a real (small) bandwidth measurement of the shim's own
fingerprint. The trials themselves need the whole stack: they run in the benchmark."""

from __future__ import annotations

import math

import pytest
import torch

from goodput import schemas
from goodput.launch.rank_env import knobs
from goodput.shim.numerics import fingerprint
from goodput.tools.bench import detect_numerics, fingerprint_cost
from goodput.tools.bench.detect_numerics import TRIALS, bound_s, bound_steps, spikes_judged


def test_each_trial_is_bounded_by_its_reading_period_plus_the_step_it_lands_late() -> None:
    by_fault = {trial.fault: trial for trial in TRIALS}
    assert [t.signal for t in TRIALS] == ["nonfinite", "loss_spike", "replica_mismatch"]
    assert bound_steps(by_fault["nan"]) == bound_steps(by_fault["loss-spike"]) == 11
    assert bound_steps(by_fault["sdc"]) == 51
    assert bound_s(by_fault["sdc"], step_s=0.2, poll_s=0.5) == pytest.approx(51 * 0.2 + 0.5)


def test_the_jobs_periods_are_knobs_the_shim_accepts() -> None:
    env = knobs(
        numerics_every=detect_numerics.NUMERICS_EVERY,
        fingerprint_every=detect_numerics.FINGERPRINT_EVERY,
    )
    assert env == {"GOODPUT_NUMERICS_EVERY": "10", "GOODPUT_FINGERPRINT_EVERY": "50"}
    assert detect_numerics.FINGERPRINT_EVERY % detect_numerics.NUMERICS_EVERY == 0


def window(end: int, steps: int = 10) -> schemas.Numerics:
    return schemas.Numerics(
        job="bench", node="node-0", rank=0, step=end, steps=steps, loss_mean=1.5, loss_max=2.0
    )


def test_the_spike_waits_for_the_judges_warm_up_in_the_jobs_current_timeline() -> None:
    """Run 2 of 2026-11-29: the job went back to step 25 (a hot swap) and later on to a
    checkpoint at 257; at step 273 only 4 windows of its timeline were behind the judge, and
    the spike sent then was not judged. The bench now asks the judge."""
    first_run = [window(end) for end in range(10, 251, 10)]
    assert spikes_judged(first_run)
    back_and_on = [*first_run, window(30, steps=5), window(40), window(260, steps=3), window(270)]
    assert not spikes_judged(back_and_on)
    later = [*back_and_on, *(window(end) for end in range(280, 330, 10))]
    assert spikes_judged(later)


def test_the_spike_is_sent_where_its_window_does_not_end_at_a_fingerprint() -> None:
    clear = detect_numerics.spike_clear_of_a_fingerprint
    assert detect_numerics.window_end(191) == detect_numerics.window_end(200) == 200
    # a fault lands one or two steps after the step reported when it was sent
    assert not clear(189)  # lands at 190 or 191: 191 is in 191-200
    assert not clear(199)  # lands at 200 or 201: 200 is
    assert clear(200) and clear(188)
    sent = [step for step in range(1, 101) if clear(step)]
    assert len(sent) == 100 - 2 * 11  # 39-49 and 89-99 are not


def test_a_70b_model_on_8_way_tensor_parallel_h100s_by_arithmetic() -> None:
    at_h200 = fingerprint_cost.projected(70e9, 2, 8, 398.0, 100)
    assert at_h200["bytes_per_gpu"] == 17.5e9
    assert at_h200["fingerprint_s"] == pytest.approx(17.5e9 / 398e9)  # 44 ms
    assert at_h200["per_step_s"] == pytest.approx(at_h200["fingerprint_s"] / 100)
    # within 1 % of any step 100 x the amortised cost or longer
    assert at_h200["within_budget_for_steps_from_s"] == pytest.approx(at_h200["fingerprint_s"])
    named = fingerprint_cost.seventy_b_on_h100(cpu_bf16_gbs=2.0, fingerprint_every=100)
    assert set(named) == {"this_cpu_measured_bf16", "h200_measured_bf16", "h100_hbm3_peak"}
    assert named["h100_hbm3_peak"]["fingerprint_s"] == pytest.approx(17.5e9 / 3.35e12)
    assert named["this_cpu_measured_bf16"]["fingerprint_s"] == pytest.approx(8.75)


@pytest.mark.parametrize("bad", [(0, 2, 8, 1.0, 100), (70e9, 2, 0, 1.0, 100), (70e9, 2, 8, 0, 1)])
def test_a_projection_from_nothing_is_refused(bad) -> None:
    with pytest.raises(ValueError):
        fingerprint_cost.projected(*bad)


def test_the_share_of_a_step() -> None:
    assert fingerprint_cost.share_per_step(0.0005, 50, 0.25) == pytest.approx(4e-5)
    for every, step_s in ((0, 0.25), (50, 0.0)):
        with pytest.raises(ValueError):
            fingerprint_cost.share_per_step(0.0005, every, step_s)


def test_the_measured_set_is_whole_transformer_layers_of_the_asked_size() -> None:
    shapes = fingerprint_cost.layer_shapes(64)
    assert sum(math.prod(s) for s in shapes) == 12 * 64 * 64 + 2 * 64
    parameters = fingerprint_cost.parameter_set(64, torch.bfloat16, 4 * 2**20)
    size = sum(p.numel() * p.element_size() for p in parameters)
    assert len(parameters) % len(shapes) == 0
    assert abs(size - 4 * 2**20) <= sum(math.prod(s) for s in shapes) * 2 / 2  # half a layer
    assert all(p.dtype == torch.bfloat16 for p in parameters)


def test_the_bandwidth_is_the_shims_fingerprint_timed_on_one_thread(monkeypatch) -> None:
    summed: list[int] = []

    def counted(parameters):
        summed.append(sum(p.numel() for p in parameters))
        return fingerprint(parameters)

    monkeypatch.setattr(fingerprint_cost, "fingerprint", counted)
    threads = torch.get_num_threads()
    report = fingerprint_cost.bandwidth_gbs(repeats=2, total_bytes=2**20)
    assert torch.get_num_threads() == threads  # restored
    assert set(report) == {"float32", "bfloat16"}
    for figures in report.values():
        assert 0 < figures["min"] <= figures["median"] <= figures["max"]
        assert set(figures["by_width"]) == set(fingerprint_cost.WIDTHS)
        assert all(len(w["gbs"]) == 2 for w in figures["by_width"].values())
    # a warm-up and two timed sums per width and dtype, each over the whole set
    assert len(summed) == 2 * len(fingerprint_cost.WIDTHS) * 3


def test_the_table_shows_each_figure_beside_its_bound() -> None:
    trial = {
        "detect_steps": 7,
        "bound_steps": 11,
        "detect_s": 2.5,
        "bound_s": 3.2,
        "decision": "numerical-rollback",
        "node": "node-1",
        "nodes_named": ["node-0", "node-1"],
    }
    numerics = {"nan": trial, "loss-spike": trial, "sdc": trial}
    rows = detect_numerics.table_rows(numerics)
    assert ("nan → nonfinite, steps", "7", "≤ 11") in rows
    assert ("sdc → replica_mismatch, s", "2.5", "≤ 3.2") in rows
    assert ("sdc: node the signal named", "node-0, node-1", "node-1 flipped") in rows
