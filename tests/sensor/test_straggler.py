"""Straggler detection on a loaded machine: load bursts are not stragglers, persistent slowness is.

Synthetic runs jitter each rank's compute time by ±15% per step (a ratio to the peer between
0.74 and 1.35, the bulk of what the recorded traces in ``traces/`` show on a loaded 2-core VM);
the recorded traces themselves, with their rarer outliers and bursts, are replayed at the end.
"""

from __future__ import annotations

import gzip
import random
from pathlib import Path
from typing import Union

import msgspec
import pytest

from goodput import schemas
from goodput.supervisor.detect.detector import Detector
from goodput.supervisor.detect.straggler import StragglerTracker

from .synthetic import JOB, at, straggler_due

TRACES = Path(__file__).parent / "traces"
JITTER = 0.15


def loaded_run(
    steps: int, ranks: int, seed: int, slow: dict[int, tuple[int, int, float]]
) -> list[tuple[int, schemas.Event]]:
    """Step reports of a job on a loaded machine; ``slow[rank] = (from_step, to_step, factor)``."""
    rng = random.Random(seed)
    events: list[tuple[int, schemas.Event]] = [
        (
            at(0),
            schemas.RankStarted(
                job=JOB, node=f"node{r}", rank=r, local_rank=0, world_size=ranks, pid=100 + r
            ),
        )
        for r in range(ranks)
    ]
    clock = 0.0
    for step in range(steps):
        times = []
        for rank in range(ranks):
            seconds = 0.35 * rng.uniform(1 - JITTER, 1 + JITTER)
            first, last, factor = slow.get(rank, (0, -1, 1.0))
            if first <= step <= last:
                seconds *= factor
            times.append(seconds)
        clock += max(times)
        events += [
            (
                at(clock),
                schemas.StepDone(
                    job=JOB,
                    node=f"node{rank}",
                    rank=rank,
                    step=step,
                    step_time_s=max(times),
                    compute_time_s=seconds,
                    tokens=1024,
                    loss=1.0,
                    world_size=ranks,
                ),
            )
            for rank, seconds in enumerate(times)
        ]
    return events


def stragglers(events: list[tuple[int, schemas.Event]]) -> list[schemas.Signal]:
    detector = Detector(JOB)
    signals = []
    for ts, event in events:
        signals += detector.on_event(event, ts)
    return [s for s in signals if s.signal == "straggler"]


@pytest.mark.parametrize("ranks", [2, 8])
@pytest.mark.parametrize("seed", range(10))
def test_a_healthy_rank_1_42x_its_peers_for_10_steps_amid_load_is_not_flagged(
    seed: int, ranks: int
) -> None:
    """The reported false positive: a load burst of 10 steps at 1.42×, then healthy again."""
    events = loaded_run(200, ranks, seed, slow={1: (100, 109, 1.42)})
    assert stragglers(events) == []


@pytest.mark.parametrize("ranks", [2, 8])
@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("factor", [1.5, 1.35])
def test_a_persistent_1_5x_straggler_amid_load_is_flagged_once_its_window_held(
    seed: int, ranks: int, factor: float
) -> None:
    """1.35×: what the chaos tool's 1.5× duty cycle measures under load."""
    events = loaded_run(200, ranks, seed, slow={1: (100, 199, factor)})
    signals = stragglers(events)
    assert [(s.node, s.rank) for s in signals] == [("node1", 1)]
    # the ratio the policy weighs tolerating against evicting (the load blurs it)
    assert 1.25 <= signals[0].ratio <= factor * 1.25
    assert signals[0].ts <= straggler_due(events, 1, 100)


def test_bursts_of_any_height_shorter_than_half_the_window_are_not_flagged() -> None:
    tracker = StragglerTracker(ratio=1.35, window=20, hold_s=0.0)
    flagged = []
    for step in range(200):
        slow = step % 20 < 10  # 10 steps 5× slower, 10 steps healthy, over and over
        flagged += tracker.observe(1, step, 5.0 if slow else 1.0, 2, at(step))
        flagged += tracker.observe(0, step, 1.0, 2, at(step))
    assert flagged == []


def test_slowness_shorter_than_the_hold_is_not_flagged_and_longer_is() -> None:
    """Fast steps: a healthy rank slowed by contention for 30 steps of 0.2 s (6 s) is not a
    straggler; the same slowness still there 20 s later is."""
    tracker = StragglerTracker(ratio=1.25, window=20, hold_s=20.0)

    def run(steps: range, factor: float) -> list[tuple[int, float]]:
        flagged = []
        for step in steps:
            flagged += tracker.observe(0, step, 0.2, 2, at(step * 0.2))
            flagged += tracker.observe(1, step, 0.2 * factor, 2, at(step * 0.2))
        return flagged

    assert run(range(0, 20), 1.0) == []
    assert run(range(20, 50), 1.4) == []  # 6 s at 1.4×: its window reached the ratio, briefly
    assert run(range(50, 100), 1.0) == []
    assert run(range(100, 210), 1.4) == []  # the window reaches 1.4× at step 110, held 20 s...
    assert run(range(210, 211), 1.4) == [(1, pytest.approx(1.4))]  # ...at step 210


def test_the_flag_clears_when_the_rank_recovers_and_may_fire_again() -> None:
    tracker = StragglerTracker(ratio=1.35, window=20, hold_s=0.0)

    def run(steps: range, factor: float) -> list[tuple[int, float]]:
        flagged = []
        for step in steps:
            flagged += tracker.observe(0, step, 1.0, 2, at(step))
            flagged += tracker.observe(1, step, factor, 2, at(step))
        return flagged

    assert run(range(0, 20), 1.0) == []
    assert run(range(20, 31), 1.5) == [(1, 1.5)]  # the 11th slow step of 20
    assert run(range(31, 80), 1.0) == [] and not tracker.is_flagged(1)
    assert run(range(80, 91), 1.5) == [(1, 1.5)]


_decoder = msgspec.json.Decoder(Union[schemas.EVENT_TYPES])  # type: ignore[valid-type]  # noqa: UP007


def replay(name: str) -> tuple[list[schemas.Event], list[schemas.Signal]]:
    """A recorded trace through a fresh detector: its events and the straggler signals."""
    with gzip.open(TRACES / name) as lines:
        events = [_decoder.decode(line) for line in lines]
    detector = Detector(JOB)
    signals = []
    for event in events:
        if isinstance(event, schemas.Signal):
            continue  # what the detector of the recording said
        signals += detector.on_event(msgspec.structs.replace(event, job=JOB), event.ts)
    return events, [s for s in signals if s.signal == "straggler"]


def test_recorded_unperturbed_run_under_load_raises_nothing() -> None:
    events, signals = replay("bench-detect-2026-11-23-load4to7-healthy500-slowed10.jsonl.gz")
    assert max(e.step for e in events if isinstance(e, schemas.StepDone)) == 510
    assert signals == []  # 500 healthy steps; the 10 slowed ones are too few to judge


def test_recorded_1_5x_straggler_under_load_is_found_once_its_window_held() -> None:
    events, signals = replay("slow-rank-2026-11-23-load11-healthy150-slowed59.jsonl.gz")
    assert [(s.node, s.rank) for s in signals] == [("node-1", 1)]
    reports = [(e.ts, e) for e in events if isinstance(e, schemas.StepDone)]
    steps_by_then = [e.step for ts, e in reports if ts <= signals[0].ts]
    # found while it is still slow: a marginal straggler (the duty cycle measures 1.27× at this
    # load) reaches the ratio later than a whole window, and is then held 20 s
    assert 150 + 20 < max(steps_by_then) <= 150 + 59
