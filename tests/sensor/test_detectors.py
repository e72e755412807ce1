"""The detector against synthetic, seeded event sequences with realistic noise."""

from __future__ import annotations

import re

import msgspec
import pytest

from goodput import schemas
from goodput.supervisor.detect.detector import NS, Detector
from goodput.supervisor.detect.thresholds import Thresholds, updated

from .synthetic import JOB, Run, at, feed, straggler_due


def started(rank: int, node: str, attempt: int = 0, world_size: int = 4) -> schemas.RankStarted:
    return schemas.RankStarted(
        job=JOB,
        node=node,
        rank=rank,
        local_rank=rank % 2,
        world_size=world_size,
        pid=100 + rank,
        attempt=attempt,
    )


def heartbeat(rank: int, node: str, step: int, busy: str = "") -> schemas.Heartbeat:
    return schemas.Heartbeat(job=JOB, node=node, rank=rank, pid=100 + rank, step=step, busy=busy)


def exited(rank: int, node: str, code: int | None, reason: str = "", attempt: int = 0):
    return schemas.RankExited(
        job=JOB,
        node=node,
        rank=rank,
        pid=100 + rank,
        exit_code=code,
        expected_reason=reason,
        attempt=attempt,
    )


def host(node: str, **fields) -> schemas.HostHealth:
    return schemas.HostHealth(job=JOB, node=node, gpu_available=True, **{"healthy": True, **fields})


def steady(ranks: dict[int, str], seconds: float, *, step_s: float = 1.0, start: float = 0.0):
    """Every rank heartbeats each second and steps every ``step_s``: a healthy job."""
    events = [(at(start), started(r, n, world_size=len(ranks))) for r, n in ranks.items()]
    t = start
    while t < start + seconds:
        t += 1.0
        step = int((t - start) / step_s)
        events += [(at(t), heartbeat(r, n, step)) for r, n in ranks.items()]
    return events


FOUR = {0: "node0", 1: "node0", 2: "node1", 3: "node1"}


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_unperturbed_noisy_run_of_500_steps_raises_nothing(seed: int) -> None:
    run = Run(nodes=8, ranks_per_node=4, seed=seed)
    assert feed(Detector(JOB), run.events(500)) == []


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


def test_lost_node_is_one_uncorrectable_missed_heartbeat_in_time() -> None:
    thresholds = Thresholds()
    detector = Detector(JOB, thresholds)
    events = steady(FOUR, 10)
    # node1 goes silent at t=10; node0 keeps heartbeating
    events += [(at(t), heartbeat(r, "node0", int(t))) for t in range(11, 40) for r in (0, 1)]
    signals = feed(detector, events)
    assert [(s.signal, s.node, s.rank, s.severity) for s in signals] == [
        ("missed_heartbeat", "node1", None, "uncorrectable")
    ]
    limit = thresholds.heartbeat_timeout_s + thresholds.heartbeat_polling_period_s
    assert signals[0].ts - signals[0].observed_ts <= limit * NS


def test_a_node_lost_with_its_host_monitor_is_lost_though_it_reported_last() -> None:
    """The host monitor died with the ranks, its last report after their last heartbeat (a
    node agent's host killed outright): still a lost node, not one silent rank."""
    detector = Detector(JOB)
    events = steady(FOUR, 10)
    events += [(at(t + 0.5), host("node1")) for t in range(0, 11, 2)]  # the last at 10.5 s
    events += [(at(t), heartbeat(r, "node0", int(t))) for t in range(11, 40) for r in (0, 1)]
    events += [(at(t + 0.5), host("node0")) for t in range(0, 40, 2)]
    signals = feed(detector, events)
    assert [(s.signal, s.node, s.rank, s.severity) for s in signals] == [
        ("missed_heartbeat", "node1", None, "uncorrectable")
    ]


def test_one_silent_rank_on_a_reporting_host_is_correctable() -> None:
    detector = Detector(JOB)
    events = steady(FOUR, 5)
    events += [(at(t), heartbeat(r, FOUR[r], int(t))) for t in range(6, 30) for r in (0, 2, 3)]
    events += [(at(t + 0.5), host("node0")) for t in range(0, 30)]
    signals = feed(detector, events)
    assert [(s.signal, s.node, s.rank, s.severity) for s in signals] == [
        ("missed_heartbeat", "node0", 1, "correctable")
    ]
    assert "host still reports" in signals[0].detail


def test_hang_timeout_adapts_to_slow_steps() -> None:
    # 6 s steps with 2× spikes: a fixed 10 s hang timeout would fire; the adaptive one must not
    run = Run(nodes=2, ranks_per_node=2, step_s=6.0, checkpoint_every=0, seed=5)
    run.spike_probability = 0.05
    detector = Detector(JOB)
    events = run.events(60)
    assert feed(detector, events) == []
    timeout = detector.hang_timeout_s(0)
    margin = detector.thresholds.hang_safety_factor
    assert margin * 6.0 <= timeout <= margin * 6.0 * 2.2 * 1.1
    # then every rank stalls while its heartbeat thread goes on: one hang, not four
    end = events[-1][0]
    last_step = 59
    stall = [
        (end + int(t * NS), heartbeat(r, run.node_of(r), last_step))
        for t in range(1, 240)
        for r in range(4)
    ]
    signals = feed(detector, stall)
    # nobody restarted it: after jobset_downtime_threshold_s the job is down as well (first,
    # when the learnt hang timeout of such slow steps is the longer)
    assert sorted(s.signal for s in signals) == ["hang", "job_down"]
    [hang] = [s for s in signals if s.signal == "hang"]
    waited = (hang.ts - hang.observed_ts) / NS
    its_timeout = detector.hang_timeout_s(hang.rank)
    assert its_timeout <= waited <= its_timeout + 1.5
    assert f"past step {last_step}" in hang.detail


def test_checkpoint_save_and_load_never_look_like_a_hang() -> None:
    detector = Detector(JOB)
    events = steady(FOUR, 20)
    busy = [
        (at(t), heartbeat(r, n, 20, busy="checkpoint-save"))
        for t in range(21, 200)
        for r, n in FOUR.items()
    ]
    events += busy
    events += [
        (at(t), heartbeat(r, n, 20 + t - 200)) for t in range(200, 230) for r, n in FOUR.items()
    ]
    # a restore after a restart: long load, then training goes on
    for r, n in FOUR.items():
        events.append((at(230.5), started(r, n, attempt=1)))
    events += [
        (at(t), heartbeat(r, n, 0, busy="checkpoint-load"))
        for t in range(231, 500)
        for r, n in FOUR.items()
    ]
    events += [
        (
            at(500.2),
            schemas.CheckpointRestored(
                job=JOB, node=n, rank=r, step=20, tier="peer", duration_s=269.0
            ),
        )
        for r, n in FOUR.items()
    ]
    events += [
        (at(t), heartbeat(r, n, 21 + t - 501)) for t in range(501, 540) for r, n in FOUR.items()
    ]
    assert feed(detector, sorted(events, key=lambda e: e[0])) == []


def test_a_checkpoint_that_never_ends_is_a_hang_eventually() -> None:
    detector = Detector(JOB, updated(Thresholds(), {"checkpoint_timeout_s": 60}))
    events = steady(FOUR, 5)
    events += [
        (at(t), heartbeat(r, n, 5, busy="checkpoint-save"))
        for t in range(6, 100)
        for r, n in FOUR.items()
    ]
    signals = feed(detector, events)
    assert [s.signal for s in signals] == ["hang"]
    assert "stuck in checkpoint-save" in signals[0].detail
    assert signals[0].ts >= at(66)


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


def test_degraded_host_once_per_fault_set_then_returned() -> None:
    detector = Detector(JOB)
    xid = schemas.GpuHealth(index=3, uuid="GPU-3", xid_errors=[79])
    first = detector.on_event(host("node1", healthy=False, gpus=[xid]), at(1))
    again = detector.on_event(host("node1", healthy=False, gpus=[xid]), at(2))
    disk = detector.on_event(
        host("node1", healthy=False, gpus=[xid], faults=["disk full: /ckpt"]), at(3)
    )
    back = detector.on_event(host("node1"), at(4))
    assert [(s.signal, s.severity) for s in first] == [("degraded_host", "uncorrectable")]
    assert "gpu3 xid 79" in first[0].detail
    assert again == []
    assert [s.signal for s in disk] == ["degraded_host"] and "disk full" in disk[0].detail
    assert [(s.signal, s.node, s.severity) for s in back] == [("node_returned", "node1", "info")]
    assert detector.on_event(host("node1"), at(5)) == []


def test_a_thermal_slowdown_is_not_a_degraded_host() -> None:
    """Throttling slows the GPU, it does not lose the host: the straggler detector judges it by
    the steps it slows (debounced by its window and hold), the host report raises nothing."""
    detector = Detector(JOB)
    hot = schemas.GpuHealth(
        index=0, uuid="GPU-0", temperature_c=93, throttle_reasons=["sw_thermal"]
    )
    assert (
        detector.on_event(host("node1", healthy=False, gpus=[hot], faults=["thermal"]), at(1)) == []
    )
    # XID 45 is the cleanup after an application ended: nothing either
    cleanup = schemas.GpuHealth(index=1, uuid="GPU-1", xid_errors=[45])
    assert (
        detector.on_event(
            host("node1", healthy=False, gpus=[cleanup], faults=["gpu_xid:45"]), at(2)
        )
        == []
    )
    assert detector.on_event(host("node1"), at(3)) == []


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


def test_the_drivers_recovery_request_is_news_even_with_the_same_xids() -> None:
    detector = Detector(JOB)
    app = schemas.GpuHealth(index=1, uuid="GPU-1", xid_errors=[13])
    first = detector.on_event(
        host("node1", healthy=False, gpus=[app], faults=["gpu_xid:13"]), at(1)
    )
    assert [s.signal for s in first] == ["degraded_host"]
    reboot = msgspec.structs.replace(app, recovery_action="node_reboot")
    (again,) = detector.on_event(
        host("node1", healthy=False, gpus=[reboot], faults=["gpu_xid:13"]), at(2)
    )
    assert again.gpus == [reboot] and "gpu1 recovery node_reboot" in again.detail


def test_a_host_signal_carries_the_faults_and_unhealthy_gpus_as_evidence() -> None:
    detector = Detector(JOB)
    healthy = schemas.GpuHealth(index=0, uuid="GPU-0")
    xid = schemas.GpuHealth(index=1, uuid="GPU-1", xid_errors=[48])
    (signal,) = detector.on_event(
        host("node1", healthy=False, gpus=[healthy, xid], faults=["gpu_xid:48"]), at(1)
    )
    assert signal.host_faults == ["gpu_xid:48"] and signal.gpus == [xid]


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


def test_poll_touches_nothing_while_heartbeats_flow() -> None:
    """10,000 nodes: between heartbeats a poll finds nothing due (no scan of all ranks)."""
    detector = Detector(JOB)
    nodes = 10_000
    for second in range(3):
        now = at(second)
        for rank in range(nodes):
            detector.on_heartbeat(heartbeat(rank, f"n{rank}", second), now + rank)
        assert detector.poll(now + nodes) == []
    assert detector.next_deadline() == at(0) + int(Thresholds().heartbeat_timeout_s * NS)


def test_slow_start_is_not_a_missed_heartbeat_but_no_start_is() -> None:
    detector = Detector(JOB)
    events = [(at(0), started(r, n)) for r, n in FOUR.items()]
    # ranks 0-2 take 30 s to import and then heartbeat; rank 3 never does
    events += [(at(t), heartbeat(r, FOUR[r], 0)) for t in range(30, 70) for r in (0, 1, 2)]
    events += [(at(t + 0.5), host(n)) for t in range(0, 70) for n in ("node0", "node1")]
    signals = feed(detector, events)
    assert [(s.signal, s.rank) for s in signals] == [("missed_heartbeat", 3)]
    limit = Thresholds().first_heartbeat_timeout_s + Thresholds().heartbeat_polling_period_s
    assert signals[0].ts <= at(limit)


def test_a_node_lost_during_an_open_incident_is_still_reported() -> None:
    detector = Detector(JOB)
    events = steady(FOUR, 5)
    events += [(at(5.2), exited(0, "node0", 1))]
    # node1's ranks stop heartbeating: first like collateral, then the whole host is gone
    events += [(at(t), heartbeat(1, "node0", 5)) for t in range(6, 30)]
    signals = feed(detector, events)
    assert [(s.signal, s.node, s.severity) for s in signals] == [
        ("crash", "node0", "correctable"),
        ("missed_heartbeat", "node1", "uncorrectable"),
    ]


def test_straggler_found_without_world_size_in_step_reports() -> None:
    run = Run(nodes=3, ranks_per_node=1, slow={2}, slow_from=20, seed=11)
    events = [
        (ts, msgspec.structs.replace(e, world_size=1) if isinstance(e, schemas.StepDone) else e)
        for ts, e in run.events(80)
    ]
    signals = feed(Detector(JOB), events)
    assert [(s.signal, s.rank) for s in signals] == [("straggler", 2)]


def test_a_slow_process_start_does_not_stretch_the_heartbeat_timeout() -> None:
    """The first beat of a new process follows its start-up (imports), not a previous beat."""
    from goodput import schemas
    from goodput.supervisor.detect.detector import Detector
    from goodput.supervisor.detect.thresholds import Thresholds

    second = 1_000_000_000
    detector = Detector("job", Thresholds(heartbeat_timeout_s=3.0, heartbeat_polling_period_s=0.5))
    detector.on_rank_started(
        schemas.RankStarted(
            job="job", node="n0", rank=0, local_rank=0, world_size=1, pid=1, attempt=1
        ),
        0,
    )
    now = 4 * second  # four seconds of interpreter start-up before the first beat
    for _ in range(10):
        detector.on_heartbeat(schemas.Heartbeat(job="job", node="n0", rank=0, pid=1, step=0), now)
        now += second // 2
    last_beat = now - second // 2
    signals = []
    while not signals and now < last_beat + 10 * second:
        signals = detector.poll(now)
        now += second // 2
    assert signals and signals[0].signal == "missed_heartbeat"
    assert (now - last_beat) / second <= 3.0 + 0.5 + 0.5


TWO = {0: "node-0", 1: "node-1"}


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


def test_a_hang_is_blamed_on_the_rank_that_did_not_finish_the_step() -> None:
    """node-0 hangs inside step 6 (its heartbeat already names it); node-1 finished step 6 and
    waits for it in the next collective. node-1's deadline comes first, yet node-0 is hung."""
    detector = Detector(JOB)
    events = steady(TWO, 5)
    for step in range(1, 6):
        events += [
            (
                at(step + 0.1),
                schemas.StepDone(
                    job=JOB,
                    node=n,
                    rank=r,
                    step=step,
                    step_time_s=1.0,
                    tokens=1,
                    loss=1.0,
                    world_size=2,
                ),
            )
            for r, n in TWO.items()
        ]
    events += [
        (
            at(6.1),
            schemas.StepDone(
                job=JOB,
                node="node-1",
                rank=1,
                step=6,
                step_time_s=1.0,
                tokens=1,
                loss=1.0,
                world_size=2,
            ),
        )
    ]
    events += [(at(6.4), heartbeat(0, "node-0", 6)), (at(6.2), heartbeat(1, "node-1", 6))]
    events += [(at(6 + t), heartbeat(r, n, 6)) for t in range(1, 40) for r, n in TWO.items()]
    signals = [s for s in feed(detector, events, until=at(45)) if s.signal == "hang"]
    assert [(s.node, s.rank) for s in signals] == [("node-0", 0)]
    assert "node-1" not in signals[0].detail.split(";")[0]
    # the wait that crossed a timeout is said: the demo's operators read "no progress for
    # 2.8 s (timeout 3.0 s)" of the laggard, whose heartbeat named the step after its peer's
    waited = re.search(
        r"node-1 finished step 6 and has waited ([\d.]+) s for it \(timeout ([\d.]+) s\)",
        signals[0].detail,
    )
    assert waited is not None, signals[0].detail
    assert float(waited[1]) >= float(waited[2])


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


def _done(rank: int, node: str, step: int) -> schemas.StepDone:
    return schemas.StepDone(
        job=JOB,
        node=node,
        rank=rank,
        step=step,
        step_time_s=1.0,
        tokens=1,
        loss=1.0,
        world_size=2,
    )


def test_a_rank_restarted_in_process_starts_its_attempt_over() -> None:
    """Rank 1 is killed at step 15 and started again; rank 0 rejoins in process and both go
    back to step 0. Rank 0's steps before the restart must not make the new rank 1, slow to
    start, look like the laggard of a hang; a real hang afterwards is still caught."""
    detector = Detector(JOB)
    events = steady(TWO, 15)
    events += [(at(s + 0.1), _done(r, n, s)) for s in range(1, 16) for r, n in TWO.items()]
    events += [(at(15.5), exited(1, "node-1", None, attempt=0))]
    rejoined = schemas.RankRejoined(job=JOB, node="node-0", rank=0, pid=100, attempt=1)
    events += [(at(16), started(1, "node-1", attempt=1, world_size=2)), (at(16.2), rejoined)]
    # the new rank 1 takes 30 s to import torch; rank 0 waits in the rendezvous, beating
    events += [(at(16 + t), heartbeat(0, "node-0", 0, busy="restarting")) for t in range(1, 31)]
    # 40 steps, past the steps rank 0 had made before: none of them is a hang
    events += [(at(46 + t), heartbeat(r, n, t)) for t in range(0, 41) for r, n in TWO.items()]
    events += [(at(46.1 + s), _done(r, n, s)) for s in range(1, 41) for r, n in TWO.items()]
    # then rank 1 hangs inside step 41 (rank 0 finished it and waits): heartbeats on
    events += [(at(87.1), _done(0, "node-0", 41))]
    events += [(at(87 + t), heartbeat(r, n, 41)) for t in range(0, 60) for r, n in TWO.items()]
    signals = feed(detector, events, until=at(150))
    crash, *later = signals
    assert crash.signal == "crash" and crash.rank == 1
    assert [(s.signal, s.rank) for s in later][:1] == [("hang", 1)], [s.detail for s in later]
    assert later[0].observed_ts >= at(87), later[0].detail  # none before the real hang


def test_a_node_reported_hung_and_then_found_lost_is_reported_lost() -> None:
    """node-1's rank hangs (reported, correctable); then its host dies — the rank's heartbeats
    stop and no host report comes: the node is lost (uncorrectable), and a restart cannot
    bring it back, so that is reported too (a node agent killed mid-step looks like this)."""
    detector = Detector(JOB)
    events = steady(TWO, 5)
    events += [(at(5 + t), heartbeat(0, "node-0", 6)) for t in range(1, 60)]
    events += [(at(5 + t), heartbeat(1, "node-1", 5)) for t in range(1, 20)]
    signals = feed(detector, events, until=at(65))
    assert [(s.signal, s.node, s.severity) for s in signals] == [
        ("hang", "node-1", "correctable"),
        ("missed_heartbeat", "node-1", "uncorrectable"),
    ]


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
