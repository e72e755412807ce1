"""A rank's CUDA cause, from its exit code (``goodput.launch.rank_env.EXIT_CODES``), on the
crash signal: a poisoned context at once; an OOM once its peers had ``oom_gather_s`` to follow,
one signal naming no node when every rank ran out (the job's memory), else the node's."""

from __future__ import annotations

from goodput.launch.rank_env import EXIT_CODES
from goodput.supervisor.detect.detector import Detector
from goodput.supervisor.detect.thresholds import Thresholds

from .synthetic import FOUR, JOB, at, exited, feed, heartbeat, started, steady

CONTEXT, OOM = EXIT_CODES["cuda-context"], EXIT_CODES["cuda-oom"]


def test_a_poisoned_context_is_a_crash_that_says_so_at_once() -> None:
    detector = Detector(JOB)
    feed(detector, steady(FOUR, 10))
    [signal] = detector.on_event(exited(2, "node1", CONTEXT), at(10.2))
    assert (signal.signal, signal.node, signal.rank, signal.severity) == (
        "crash",
        "node1",
        2,
        "correctable",
    )
    assert signal.rank_fault == "cuda-context"
    assert f"exit code {CONTEXT}" in signal.detail and "CUDA context cannot" in signal.detail
    # an ordinary crash names no CUDA cause
    other = Detector(JOB)
    feed(other, steady(FOUR, 10))
    [plain] = other.on_event(exited(2, "node1", 1), at(10.2))
    assert plain.rank_fault == ""


def test_an_oom_of_every_rank_is_one_signal_that_blames_no_node() -> None:
    detector = Detector(JOB)
    feed(detector, steady(FOUR, 10))
    signals = []
    for i, (rank, node) in enumerate(FOUR.items()):
        signals += detector.on_event(exited(rank, node, OOM), at(10.1 + 0.3 * i))
    [signal] = signals
    assert (signal.signal, signal.node, signal.rank) == ("crash", "", None)
    assert signal.rank_fault == "cuda-oom" and signal.observed_ts == at(10.1 + 0.9)
    assert "every rank (4) ran out of GPU memory" in signal.detail
    assert detector.poll(at(30)) == []  # nothing left to report


def test_an_oom_of_one_rank_is_its_nodes_once_the_gather_passed() -> None:
    detector = Detector(JOB, Thresholds(oom_gather_s=5.0))
    feed(detector, steady(FOUR, 10))
    assert detector.on_event(exited(1, "node0", OOM), at(10.5)) == []
    # its peers, blocked on it, heartbeat without progress: not hung while it is gathered
    for t in range(11, 16):
        feed(detector, [(at(t), heartbeat(r, n, 10)) for r, n in FOUR.items() if r != 1])
        assert detector.poll(at(t + 0.4)) == []
    [signal] = detector.poll(at(15.5))
    assert (signal.node, signal.rank, signal.rank_fault) == ("node0", 1, "cuda-oom")
    assert signal.observed_ts == at(10.5) and "1 of 4 rank(s) did" in signal.detail
    # the incident is open: the peers' crashes that follow are its collateral
    assert detector.on_event(exited(2, "node1", 1), at(16)) == []


def test_a_relaunch_before_the_gather_passed_covers_the_ooms() -> None:
    detector = Detector(JOB)
    feed(detector, steady(FOUR, 10))
    assert detector.on_event(exited(1, "node0", OOM), at(10.5)) == []
    for rank, node in FOUR.items():
        detector.on_event(started(rank, node, attempt=1), at(11))
    assert detector.poll(at(20)) == []
