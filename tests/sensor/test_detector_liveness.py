"""The detector on ranks that go quiet, against synthetic event sequences: lost nodes, silent
ranks, hangs (whose timeout adapts to slow steps, checkpoints and slow starts) and whom a hang
is blamed on."""

from __future__ import annotations

import re

from goodput import schemas
from goodput.supervisor.detect.detector import NS, Detector
from goodput.supervisor.detect.thresholds import Thresholds, updated

from .synthetic import (
    FOUR,
    JOB,
    TWO,
    Run,
    at,
    exited,
    feed,
    heartbeat,
    host,
    started,
    steady,
    step_done,
)


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


def test_a_hang_is_blamed_on_the_rank_that_did_not_finish_the_step() -> None:
    """node-0 hangs inside step 6 (its heartbeat already names it); node-1 finished step 6 and
    waits for it in the next collective. node-1's deadline comes first, yet node-0 is hung."""
    detector = Detector(JOB)
    events = steady(TWO, 5)
    for step in range(1, 6):
        events += [(at(step + 0.1), step_done(r, n, step)) for r, n in TWO.items()]
    events += [(at(6.1), step_done(1, "node-1", 6))]
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
