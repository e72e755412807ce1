"""The detector on ranks that end, against synthetic event sequences: crashes once per incident,
exits that are not crashes, vanished processes, a job down, attempts and restarts."""

from __future__ import annotations

from goodput import schemas
from goodput.supervisor.detect.detector import Detector
from goodput.supervisor.detect.thresholds import Thresholds, updated

from .synthetic import (
    FOUR,
    JOB,
    TWO,
    at,
    exited,
    feed,
    heartbeat,
    host,
    started,
    steady,
    step_done,
)


def test_crash_is_signalled_at_the_exit_event_and_once() -> None:
    detector = Detector(JOB)
    feed(detector, steady(FOUR, 10))
    signals = detector.on_event(exited(1, "node0", 1), at(10.2))
    assert [(s.signal, s.node, s.rank, s.severity) for s in signals] == [
        ("crash", "node0", 1, "correctable")
    ]
    assert signals[0].ts == at(10.2) and "exit code 1" in signals[0].detail
    # collateral: the other ranks die of the broken collective, rank 1 stops heartbeating
    later = detector.on_event(exited(0, "node0", -6), at(10.5))
    later += detector.on_event(exited(2, "node1", 1), at(11))
    later += feed(detector, [(at(t), heartbeat(3, "node1", 10)) for t in range(11, 30)])
    assert later == []


def test_a_restart_closes_the_incident() -> None:
    detector = Detector(JOB)
    feed(detector, steady(FOUR, 5))
    assert len(detector.on_event(exited(1, "node0", 1), at(5.5))) == 1
    for rank, node in FOUR.items():
        detector.on_event(exited(rank, node, 0, reason="restart"), at(6))
    for rank, node in FOUR.items():
        detector.on_event(started(rank, node, attempt=1), at(7))
    signals = detector.on_event(exited(3, "node1", None, attempt=1), at(8))
    assert [(s.signal, s.rank) for s in signals] == [("crash", 3)]
    assert "unknown status" in signals[0].detail


def test_stale_and_expected_exits_are_not_crashes() -> None:
    detector = Detector(JOB)
    feed(detector, steady(FOUR, 3))
    detector.on_event(started(0, "node0", attempt=2), at(3))
    assert detector.on_event(exited(0, "node0", 1, attempt=1), at(3.5)) == []
    assert detector.on_event(exited(1, "node0", -15, reason="stop"), at(4)) == []


def test_a_new_run_forgets_the_attempts_of_the_previous_one() -> None:
    detector = Detector(JOB)
    ranks = {0: "node0", 1: "node0"}
    feed(detector, [(at(0), started(r, n, attempt=3, world_size=2)) for r, n in ranks.items()])
    feed(detector, [(at(2), exited(r, n, 0, attempt=3)) for r, n in ranks.items()])
    detector.on_event(schemas.RunStarted(job=JOB, run_id="second", command_id="c"), at(5))
    # the new run's attempt 1 is not a late report of the old run's older attempt
    feed(detector, [(at(6), started(r, n, attempt=1, world_size=2)) for r, n in ranks.items()])
    signals = detector.on_event(exited(1, "node0", 1, attempt=1), at(8))
    assert [(s.signal, s.rank) for s in signals] == [("crash", 1)]


def test_vanished_process_without_exit_report_is_a_crash() -> None:
    detector = Detector(JOB)
    events = steady(FOUR, 3)
    events += [
        (at(t), host("node1", ranks_alive=1, ranks_expected=2)) for t in (3.1, 4.1, 5.1, 6.1)
    ]
    signals = feed(detector, events)
    assert [(s.signal, s.node, s.rank) for s in signals] == [("crash", "node1", None)]
    assert "1 of 2 ranks alive" in signals[0].detail
    assert signals[0].ts >= at(3.1 + Thresholds().pod_termination_threshold_s)


def test_exit_report_in_time_means_no_vanish_signal() -> None:
    detector = Detector(JOB)
    events = steady(FOUR, 10)
    events += [(at(3.1), host("node1", ranks_alive=1, ranks_expected=2))]
    events += [(at(3.5), exited(3, "node1", 0, reason="rescale"))]
    assert feed(detector, events, until=at(10)) == []


def test_a_finished_rank_leaving_slowly_is_neither_silent_nor_vanished() -> None:
    """Under load a finished rank's teardown can outlast the heartbeat timeout and the host
    monitor's count: its last beat says it is leaving, so only its exit report counts."""
    detector = Detector(JOB)
    events = steady(FOUR, 10)
    # every rank finished at t=10: one last beat saying so, then silence during teardown
    events += [(at(10.2), heartbeat(r, n, 10, busy=schemas.BUSY_EXITING)) for r, n in FOUR.items()]
    events += [(at(t + 0.5), host(n)) for t in range(10, 40) for n in ("node0", "node1")]
    events += [(at(t + 0.6), host("node1", ranks_alive=0, ranks_expected=2)) for t in (20, 21, 22)]
    events += [(at(35), exited(r, n, 0)) for r, n in FOUR.items()]
    assert feed(detector, events, until=at(40)) == []


def test_a_leaving_rank_that_never_exits_is_reported_after_the_exit_timeout() -> None:
    thresholds = Thresholds()
    detector = Detector(JOB, thresholds)
    events = steady(FOUR, 10)
    events += [(at(10.2), heartbeat(3, "node1", 10, busy=schemas.BUSY_EXITING))]
    events += [(at(t), heartbeat(r, FOUR[r], t)) for t in range(11, 80) for r in (0, 1, 2)]
    events += [(at(t + 0.5), host(n)) for t in range(10, 80) for n in ("node0", "node1")]
    signals = feed(detector, events, until=at(80))
    assert [(s.signal, s.node, s.rank) for s in signals if s.signal == "missed_heartbeat"] == [
        ("missed_heartbeat", "node1", 3)
    ]
    missed = next(s for s in signals if s.signal == "missed_heartbeat")
    assert missed.ts >= at(10.2 + thresholds.exit_timeout_s)


def test_job_down_after_a_crash_nobody_restarts() -> None:
    thresholds = updated(Thresholds(), {"jobset_downtime_threshold_s": 30})
    detector = Detector(JOB, thresholds)
    events = steady(FOUR, 5)
    events += [(at(5.5), exited(r, n, 1)) for r, n in FOUR.items()]
    signals = feed(detector, events, until=at(60))
    assert [s.signal for s in signals] == ["crash", "job_down"]
    assert signals[1].ts >= at(35) and signals[1].severity == "uncorrectable"


def test_a_job_that_finished_is_not_down() -> None:
    detector = Detector(JOB)
    events = steady(FOUR, 5)
    events += [(at(5.5), exited(r, n, 0)) for r, n in FOUR.items()]
    assert feed(detector, events, until=at(300)) == []


def test_one_rank_kill_is_one_incident_across_the_restart() -> None:
    """The host monitor still counts the killed rank's pid until the relaunch is reported; its
    '0 of 1 ranks alive' is explained by the exit report and must not become a second crash
    once the restart closed the incident."""
    detector = Detector(JOB)
    events = steady(TWO, 10)
    events += [(at(10.2), exited(0, "node-0", 1))]
    events += [(at(t), host("node-0", ranks_alive=0, ranks_expected=1)) for t in (10.6, 11.6)]
    events += [(at(11.0), exited(1, "node-1", None, reason="restart"))]
    events += [(at(11.5), started(r, n, attempt=1, world_size=2)) for r, n in TWO.items()]
    events += [(at(13.6), host("node-0", ranks_alive=1, ranks_expected=1))]
    events += [(at(11.5 + t), heartbeat(r, n, t)) for t in range(1, 8) for r, n in TWO.items()]
    signals = feed(detector, events, until=at(19))
    assert [(s.signal, s.node, s.rank) for s in signals] == [("crash", "node-0", 0)]


def test_a_host_count_against_an_older_attempt_is_no_crash_of_the_new_one() -> None:
    """Under load the host monitor may still count the previous attempt's pids (its job status
    is older than the relaunch): '0 of 1 ranks alive' then says nothing about the new ranks."""
    detector = Detector(JOB)
    events = [(at(0), started(r, n, attempt=1, world_size=2)) for r, n in TWO.items()]
    events += [(at(t), heartbeat(r, n, t)) for t in range(1, 10) for r, n in TWO.items()]
    events += [
        (at(t + 0.5), host(n, ranks_alive=1, ranks_expected=1, attempt=1))
        for t in range(9)
        for n in ("node-0", "node-1")
    ]
    # a graceful relaunch (scale-up): the old ranks leave, attempt 2 starts
    events += [(at(10.0), exited(r, n, 143, reason="scale_to")) for r, n in TWO.items()]
    events += [(at(10.5), started(r, n, attempt=2, world_size=2)) for r, n in TWO.items()]
    stale = [
        (at(10.6 + t), host(n, ranks_alive=0, ranks_expected=1, attempt=1))
        for t in range(4)
        for n in ("node-0", "node-1")
    ]
    events += stale
    events += [(at(10.5 + t), heartbeat(r, n, t)) for t in range(1, 8) for r, n in TWO.items()]
    assert feed(detector, events, until=at(18)) == []


def test_a_rank_restarted_in_process_starts_its_attempt_over() -> None:
    """Rank 1 is killed at step 15 and started again; rank 0 rejoins in process and both go
    back to step 0. Rank 0's steps before the restart must not make the new rank 1, slow to
    start, look like the laggard of a hang; a real hang afterwards is still caught."""
    detector = Detector(JOB)
    events = steady(TWO, 15)
    events += [(at(s + 0.1), step_done(r, n, s)) for s in range(1, 16) for r, n in TWO.items()]
    events += [(at(15.5), exited(1, "node-1", None, attempt=0))]
    rejoined = schemas.RankRejoined(job=JOB, node="node-0", rank=0, pid=100, attempt=1)
    events += [(at(16), started(1, "node-1", attempt=1, world_size=2)), (at(16.2), rejoined)]
    # the new rank 1 takes 30 s to import torch; rank 0 waits in the rendezvous, beating
    events += [(at(16 + t), heartbeat(0, "node-0", 0, busy="restarting")) for t in range(1, 31)]
    # 40 steps, past the steps rank 0 had made before: none of them is a hang
    events += [(at(46 + t), heartbeat(r, n, t)) for t in range(0, 41) for r, n in TWO.items()]
    events += [(at(46.1 + s), step_done(r, n, s)) for s in range(1, 41) for r, n in TWO.items()]
    # then rank 1 hangs inside step 41 (rank 0 finished it and waits): heartbeats on
    events += [(at(87.1), step_done(0, "node-0", 41))]
    events += [(at(87 + t), heartbeat(r, n, 41)) for t in range(0, 60) for r, n in TWO.items()]
    signals = feed(detector, events, until=at(150))
    crash, *later = signals
    assert crash.signal == "crash" and crash.rank == 1
    assert [(s.signal, s.rank) for s in later][:1] == [("hang", 1)], [s.detail for s in later]
    assert later[0].observed_ts >= at(87), later[0].detail  # none before the real hang
