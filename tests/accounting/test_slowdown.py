"""Step-time deviation (pure): which steps are slow, against which median."""

from __future__ import annotations

import pytest

from goodput.measure.accounting.slowdown import MIN_RUN_STEPS, KeptStep, step_time_deviation


def test_a_pace_that_drifts_between_runs_is_not_charged_but_a_slow_stretch_is() -> None:
    """Run 0 steps at 1 s, run 1 (after a restart on a busier machine) at 1.5 s with 5 steps
    at 3 s: only those 5 are slow, each 1.5 s over their run's median."""
    steps = [KeptStep(1.0, 8, 0)] * MIN_RUN_STEPS
    steps += [KeptStep(1.5, 8, 1)] * MIN_RUN_STEPS + [KeptStep(3.0, 8, 1)] * 5
    result = step_time_deviation(steps)
    assert sorted(result.excess) == list(range(2 * MIN_RUN_STEPS, 2 * MIN_RUN_STEPS + 5))
    assert all(e == pytest.approx(1.5) for e in result.excess.values())
    assert result.notes == []


def test_a_short_run_is_judged_against_its_world_size() -> None:
    """A run too short for a median of its own (a straggler evicted at once) uses the world
    size's: its slow steps are not their own reference."""
    steps = [KeptStep(1.0, 8, 0)] * MIN_RUN_STEPS + [KeptStep(3.0, 8, 1)] * 5
    result = step_time_deviation(steps)
    assert sum(result.excess.values()) == pytest.approx(5 * 2.0)


def test_noise_within_the_tolerance_costs_nothing() -> None:
    steps = [KeptStep(1.0 + 0.01 * (i % 10), 8, 0) for i in range(100)]
    assert step_time_deviation(steps).excess == {}
