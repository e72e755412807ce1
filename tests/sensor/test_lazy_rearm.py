"""A heartbeat re-arms its rank's deadlines lazily; the decisions are those of exact deadlines.

A beat arms the heartbeat entry at beat time + the timeout floor (the earliest the rank can
fall silent) and leaves the hang entry alone unless progress or busy moved; when an entry
comes due early its check re-arms it at the real deadline. These tests pin the times: a
silent rank is reported at the first poll at or after its last beat + the timeout its own
record gives, whatever its learnt gap did; a steady rank never; the hang and busy rules as
before.
"""

from __future__ import annotations

from goodput import schemas
from goodput.supervisor.detect.detector import NS, Detector
from goodput.supervisor.detect.thresholds import Thresholds
from goodput.supervisor.detect.timeouts import heartbeat_deadline

JOB = "lazy"
POLL_NS = NS // 20


def beat(rank: int, step: int, busy: str = "") -> schemas.Heartbeat:
    return schemas.Heartbeat(
        job=JOB, node=f"node{rank // 2}", rank=rank, pid=100 + rank, step=step, busy=busy
    )


def started(rank: int) -> schemas.RankStarted:
    return schemas.RankStarted(
        job=JOB,
        node=f"node{rank // 2}",
        rank=rank,
        local_rank=rank % 2,
        world_size=4,
        pid=100 + rank,
    )


def polls(detector: Detector, start: int, end: int) -> list[tuple[int, schemas.Signal]]:
    """Poll every ``POLL_NS`` from ``start`` to ``end``: (when, signal) for each signal."""
    found = []
    for now in range(start, end, POLL_NS):
        found += [(now, s) for s in detector.poll(now)]
    return found


def test_a_rank_beating_steadily_is_never_reported() -> None:
    detector = Detector(JOB, Thresholds())
    for rank in range(4):
        detector.on_event(started(rank), 0)
    now, signals = 0, []
    for tick in range(1, 241):  # 120 s of beats every 0.5 s, a step a second
        signals += polls(detector, now, tick * NS // 2)
        now = tick * NS // 2
        for rank in range(4):
            detector.on_event(beat(rank, tick // 2), now)
    assert signals == []


def silent_after(gaps_s: list[float]) -> tuple[int, int]:
    """Rank 0 beats after each gap then falls silent, its node-mate beating on: when its
    missed heartbeat was reported, and the deadline its record gave at its last beat."""
    detector = Detector(JOB, Thresholds())
    detector.on_event(started(0), 0)
    detector.on_event(started(1), 0)
    now = 0
    for step, gap in enumerate(gaps_s, start=1):
        following = now + int(gap * NS)
        # the node-mate beats every 0.5 s, so the node is not lost: rank 0 alone is silent
        for mate in range(now, following, NS // 2):
            detector.on_event(beat(1, step), mate)
        polls(detector, now, following)
        now = following
        detector.on_event(beat(0, step), now)
    expected = heartbeat_deadline(detector._run.ranks[0], detector.thresholds)
    for later in range(now, expected + 2 * POLL_NS, POLL_NS):
        detector.on_event(beat(1, later // POLL_NS), later)  # progressing: not hung
        for signal in detector.poll(later):
            if signal.signal == "missed_heartbeat":
                assert signal.rank == 0, signal.detail
                return later, expected
    raise AssertionError("rank 0 was not reported silent")


def test_a_silent_rank_is_reported_at_its_learnt_deadline() -> None:
    # beats 2.5 s apart: the timeout is 3 x the learnt gap (7.5 s), over the 5 s floor the
    # entry first comes due at
    reported, expected = silent_after([2.5] * 20)
    assert expected - reported <= 0 < reported - expected + POLL_NS


def test_a_shrinking_gap_still_reports_at_the_deadline_of_the_last_beat() -> None:
    # a long learnt gap decays as beats come quicker: the deadline moves earlier than the
    # entry armed at the slow beats' time, so the beat must have armed an earlier one
    reported, expected = silent_after([3.0] * 10 + [0.2] * 80)
    assert expected - reported <= 0 < reported - expected + POLL_NS


def test_a_rank_that_resumes_beating_without_progress_is_watched_for_a_hang_again() -> None:
    detector = Detector(JOB, Thresholds(hang_min_timeout_s=1.5, hang_warmup_timeout_s=2.0))
    for rank in range(4):
        detector.on_event(started(rank), 0)
    now = 0
    for step in range(1, 11):  # a step a second, every rank
        now = step * NS
        for rank in range(4):
            detector.on_event(beat(rank, step), now)
    assert polls(detector, 0, now) == []
    # rank 3 is silent for 8 s (its node-mate too: the node is lost), the others progress
    for step in range(11, 19):
        now = step * NS
        for rank in range(2):
            detector.on_event(beat(rank, step), now)
        polls(detector, now - NS, now)
    # its hang deadline came due while it was silent: judged a missed heartbeat, not a hang,
    # and dropped; rank 3 comes back beating step 10 again, and its hang watch must resume
    assert 3 not in detector._run.hang_deadlines
    detector.on_event(beat(3, 10), now)
    assert 3 in detector._run.hang_deadlines


def test_a_busy_rank_beating_is_hung_only_past_its_checkpoint_allowance() -> None:
    detector = Detector(JOB, Thresholds(checkpoint_timeout_s=30.0))
    detector.on_event(started(0), 0)
    detector.on_event(beat(0, 1), NS)
    detector.on_event(beat(0, 2), 2 * NS)
    busy_since = 3 * NS
    found = []
    for now in range(busy_since, busy_since + 40 * NS, NS // 2):
        detector.on_event(beat(0, 2, busy="checkpoint"), now)
        found += [(now, s) for s in detector.poll(now)]
    hangs = [(now, s) for now, s in found if s.signal == "hang"]
    assert hangs and hangs[0][0] == busy_since + 30 * NS, [(t / NS, s.detail) for t, s in found]
