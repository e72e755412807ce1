"""The detector against synthetic, seeded event sequences with realistic noise: a healthy run is
quiet, its signals are deterministic, its thresholds change while it runs."""

from __future__ import annotations

import pytest

from goodput import schemas
from goodput.supervisor.detect.detector import Detector
from goodput.supervisor.detect.thresholds import Thresholds, updated

from .synthetic import (
    FOUR,
    JOB,
    Run,
    at,
    exited,
    feed,
    heartbeat,
    steady,
)


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_unperturbed_noisy_run_of_500_steps_raises_nothing(seed: int) -> None:
    run = Run(nodes=8, ranks_per_node=4, seed=seed)
    assert feed(Detector(JOB), run.events(500)) == []


def test_thresholds_change_while_running() -> None:
    detector = Detector(JOB)
    events = steady(FOUR, 5)
    feed(detector, events)
    detector.set_thresholds(updated(detector.thresholds, {"heartbeat_timeout_s": 1.0}))
    # the learnt floor still holds: 3 × the 1 s heartbeat gap
    assert detector.poll(at(7.9)) == []
    signals = detector.poll(at(8.1))
    assert {(s.signal, s.node) for s in signals} == {
        ("missed_heartbeat", "node0"),
        ("missed_heartbeat", "node1"),
    }


def test_thresholds_validation() -> None:
    assert updated(Thresholds(), {"straggler_window": 12.0}).straggler_window == 12
    with pytest.raises(ValueError, match="unknown"):
        updated(Thresholds(), {"nope": 1.0})
    with pytest.raises(ValueError, match="positive"):
        updated(Thresholds(), {"heartbeat_timeout_s": 0})
    with pytest.raises(ValueError):
        updated(Thresholds(), {"straggler_window": 2.5})


def test_same_facts_give_the_same_signal_id() -> None:
    ids = []
    for _ in range(2):
        detector = Detector(JOB)
        feed(detector, steady(FOUR, 3))
        ids.append(detector.on_event(exited(2, "node1", 1), at(3.5))[0].signal_id)
    assert ids[0] == ids[1]


def test_the_supervisors_own_output_is_not_news_of_the_job() -> None:
    """The detector takes every event of the job's stream (the sensor service hands it all, the
    simulator what it makes) and learns only from ``OBSERVED_EVENTS``: a decision or a signal
    says nothing of the ranks, and must not make a stalled sensor think it still hears them."""
    detector = Detector(JOB)
    decision = schemas.Decision(job=JOB, signal_id="s", policy="builtin", rule="r", reason="")
    assert detector.on_event(decision, at(1)) == []
    assert detector._run.last_heard_ns == 0
    assert detector.on_event(heartbeat(0, "n0", 1), at(2)) == []
    assert detector._run.last_heard_ns == at(2)
