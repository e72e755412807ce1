"""The detector's stragglers, against synthetic, seeded event sequences: a rank or a whole node
slower than the rest, once its window held."""

from __future__ import annotations

import msgspec
import pytest

from goodput import schemas
from goodput.shim.step_rollup import GRACE_S
from goodput.supervisor.detect.detector import NS, Detector
from tests.rollups import rolled_up_per_node

from .synthetic import (
    JOB,
    Run,
    feed,
    host,
    straggler_due,
)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_straggler_found_once_its_window_held_at_1_5x(seed: int) -> None:
    run = Run(nodes=8, ranks_per_node=4, slow={13}, slowdown=1.5, slow_from=120, seed=seed)
    events = run.events(300)
    signals = feed(Detector(JOB), events)
    assert [(s.signal, s.node, s.rank) for s in signals] == [("straggler", "node3", 13)]
    assert signals[0].ts <= straggler_due(events, 13, run.slow_from)
    assert "for 20 s (threshold 1.25×)" in signals[0].detail


def test_a_whole_slow_node_is_one_straggler_signal() -> None:
    run = Run(nodes=4, ranks_per_node=4, slow={4, 5, 6, 7}, slow_from=50, seed=7)
    signals = feed(Detector(JOB), run.events(200))
    assert [(s.signal, s.node) for s in signals] == [("straggler", "node1")]


def test_two_rank_job_still_finds_its_straggler() -> None:
    run = Run(nodes=2, ranks_per_node=1, slow={1}, slow_from=30, seed=3, checkpoint_every=0)
    signals = feed(Detector(JOB), run.events(100))
    assert [(s.signal, s.rank) for s in signals] == [("straggler", 1)]


def test_a_throttled_node_that_slows_its_steps_is_a_straggler_not_a_lost_host() -> None:
    run = Run(nodes=4, ranks_per_node=4, slow={4, 5, 6, 7}, slow_from=50, seed=7)
    events = run.events(200)
    end = events[-1][0]
    hot = schemas.GpuHealth(index=0, uuid="GPU-0", throttle_reasons=["hw_thermal"])
    throttled = dict(healthy=False, gpus=[hot], faults=["thermal"])
    start = next(ts for ts, e in events if isinstance(e, schemas.StepDone) and e.step == 50)
    # node1 throttles from the step it slows until the end; node2 only for two seconds, a
    # transient software slowdown that costs no step
    events += [(ts, host("node1", **throttled)) for ts in range(start, end, 2 * NS)]
    events += [(start + i * NS, host("node2", **throttled)) for i in range(3)]
    events += [(start + 3 * NS, host("node2"))]
    signals = feed(Detector(JOB), events)
    assert [(s.signal, s.node) for s in signals] == [("straggler", "node1")]


def test_straggler_found_without_world_size_in_step_reports() -> None:
    run = Run(nodes=3, ranks_per_node=1, slow={2}, slow_from=20, seed=11)
    events = [
        (ts, msgspec.structs.replace(e, world_size=1) if isinstance(e, schemas.StepDone) else e)
        for ts, e in run.events(80)
    ]
    signals = feed(Detector(JOB), events)
    assert [(s.signal, s.rank) for s in signals] == [("straggler", 2)]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_steps_rolled_up_per_node_flag_the_same_straggler(seed: int) -> None:
    """Issue 36: the sensor takes a node's rollup apart (``schemas.expand_steps``) and judges
    the same reports, each a grace later at most."""
    run = Run(nodes=8, ranks_per_node=4, slow={13}, slowdown=1.5, slow_from=120, seed=seed)
    events = run.events(300)
    rolled = rolled_up_per_node(events)
    assert sum(isinstance(e, schemas.StepsDone) for _, e in rolled) == 8 * 300
    expanded = [(ts, each) for ts, e in rolled for each in schemas.expand_steps(e)]
    per_rank = feed(Detector(JOB), events)
    signals = feed(Detector(JOB), expanded)
    assert [(s.signal, s.node, s.rank) for s in signals] == [("straggler", "node3", 13)]
    assert [(s.signal, s.node, s.rank) for s in per_rank] == [("straggler", "node3", 13)]
    assert signals[0].ratio == pytest.approx(per_rank[0].ratio)
    assert signals[0].ts <= straggler_due(events, 13, run.slow_from) + GRACE_S * NS
