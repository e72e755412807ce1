"""The calculator against hand-built event logs with known answers (seconds)."""

from __future__ import annotations

import random
from itertools import pairwise

import msgspec
import pytest

from goodput import schemas
from goodput.measure.accounting import BADPUT_KEYS, GoodputReport, compute_goodput
from tests.accounting.scenario import (
    EXPECTED_BADPUT,
    EXPECTED_PRODUCTIVE,
    EXPECTED_TOTAL,
    JOB,
    at,
    scenario_events,
    started,
    step,
)


def test_every_badput_category_has_its_known_value() -> None:
    report = compute_goodput(scenario_events())
    assert set(report.badput) == set(BADPUT_KEYS) == set(EXPECTED_BADPUT)
    for key, expected in EXPECTED_BADPUT.items():
        assert report.badput[key] == pytest.approx(expected, abs=1e-6), key
    assert report.productive_s == pytest.approx(EXPECTED_PRODUCTIVE, abs=1e-6)
    assert report.total_s == pytest.approx(EXPECTED_TOTAL, abs=1e-6)


def test_categories_add_up_to_the_total() -> None:
    report = compute_goodput(scenario_events())
    assert report.productive_s + sum(report.badput.values()) == pytest.approx(report.total_s)
    assert (report.end_ts_ns - report.start_ts_ns) / 1e9 == pytest.approx(report.total_s)
    assert report.goodput_pct == pytest.approx(100 * EXPECTED_PRODUCTIVE / EXPECTED_TOTAL)


def test_reliability_figures() -> None:
    report = compute_goodput(scenario_events())
    # one failure (the crash); the scale-down to evict the straggler was planned
    assert report.interruptions == 1
    (failure,) = report.failures
    assert failure.fault_s == pytest.approx(28)
    assert failure.detected_s == pytest.approx(31)
    assert failure.decided_s == pytest.approx(33)
    assert failure.restarted_s == pytest.approx(40)
    assert failure.resumed_s == pytest.approx(47)
    assert failure.repair_s == pytest.approx(19)
    assert "crash" in failure.cause
    assert report.mttr_s == pytest.approx(19)
    # running time: 10–27, 45–68 and 75–80
    assert report.mtbf_s == pytest.approx(17 + 23 + 5)
    # productive / (total − job down)
    assert report.ettr == pytest.approx(EXPECTED_PRODUCTIVE / (EXPECTED_TOTAL - 2.0))


def test_step_accounting() -> None:
    report = compute_goodput(scenario_events())
    assert report.steps_productive == 16  # steps 1–16, each kept once
    assert report.steps_wasted == 3  # the first runs of steps 6, 7 and 8
    assert report.nominal_world_size == 2
    assert report.healthy_step_time_s == {2: pytest.approx(2.0), 1: pytest.approx(2.5)}
    thrown_away = [p.step for p in report.timeline.steps if not p.productive]
    assert thrown_away == [6, 7, 8]


def test_timeline_marks_what_happened() -> None:
    timeline = compute_goodput(scenario_events()).timeline
    kinds = {(m.kind, round(m.t_s, 3)) for m in timeline.markers}
    assert {("failure", 28), ("restart", 40), ("restart", 72), ("scale", 75)} <= kinds
    assert {("checkpoint", 22), ("restore", 44), ("restore", 74), ("straggler", 56)} <= kinds
    spans = timeline.spans
    assert spans[0].start_s == 0 and spans[-1].end_s == pytest.approx(EXPECTED_TOTAL)
    assert all(a.end_s == pytest.approx(b.start_s) for a, b in pairwise(spans))


def test_report_is_json_serialisable_and_round_trips() -> None:
    report = compute_goodput(scenario_events())
    decoded = msgspec.json.decode(msgspec.json.encode(report), type=GoodputReport)
    assert decoded == report


def test_order_of_arrival_does_not_matter() -> None:
    events = scenario_events()
    shuffled = events[:]
    random.Random(7).shuffle(shuffled)
    assert compute_goodput(shuffled) == compute_goodput(events)


def test_nominal_world_size_can_be_given() -> None:
    # a job configured for 4 ranks that never got more than 2 idled half its capacity
    report = compute_goodput(scenario_events(), nominal_world_size=4)
    idle_at_2 = 0.5 * (10 + 10 + 4 + 2 + 2)  # kept step time at 2 of 4 ranks, less straggling
    idle_at_1 = 0.75 * 5
    assert report.badput["scaled_down_idle"] == pytest.approx(idle_at_2 + idle_at_1)
    assert report.productive_s + sum(report.badput.values()) == pytest.approx(report.total_s)


def test_failure_without_recovery_leaves_the_job_down() -> None:
    events: list[schemas.Event] = [started(0, 0, 1)]
    events += step(5, 1, 5.0, 1) + step(10, 2, 5.0, 1)
    events += [
        schemas.RankExited(
            job=JOB, ts=at(12), node="n0", rank=0, pid=100, exit_code=None, signal=9
        ),
        schemas.Signal(job=JOB, ts=at(15), signal="crash", node="n0", observed_ts=at(12)),
        schemas.HostHealth(job=JOB, ts=at(20), node="n0", healthy=False, gpu_available=False),
        schemas.Signal(job=JOB, ts=at(30), signal="job_down", node="n0", severity="uncorrectable"),
    ]
    report = compute_goodput(events)
    # steps 1 and 2 were never thrown away: nothing restored past them
    assert report.productive_s == pytest.approx(10)
    assert report.badput["wasted_progress"] == pytest.approx(2)  # the step cut short at 12
    assert report.badput["failure_detection"] == pytest.approx(3)
    assert report.badput["job_down"] == pytest.approx(15)  # 15–30: nobody acted
    assert report.total_s == pytest.approx(30)
    assert report.interruptions == 1
    assert report.failures[0].resumed_s is None and report.mttr_s is None
    assert report.mtbf_s == pytest.approx(10)


def test_hang_is_detected_from_the_signal_alone() -> None:
    hang = schemas.Signal(job=JOB, ts=at(25), signal="hang", node="n0", observed_ts=at(10))
    events: list[schemas.Event] = [started(0, 0, 1), *step(5, 1, 5.0, 1), *step(10, 2, 5.0, 1)]
    events += [
        hang,
        schemas.Decision(
            job=JOB,
            ts=at(26),
            signal_id=hang.signal_id,
            policy="p",
            rule="hang->restart",
            reason="no progress",
            command_ids=["r"],
        ),
        schemas.RankExited(
            job=JOB, ts=at(27), node="n0", rank=0, pid=100, exit_code=-15, expected_reason="restart"
        ),
        started(30, 0, 1),
        *step(36, 3, 5.0, 1),
    ]
    report = compute_goodput(events)
    assert report.badput["failure_detection"] == pytest.approx(15)
    assert report.badput["decision"] == pytest.approx(1)
    assert report.badput["restart_reprovision"] == pytest.approx(4)
    assert report.badput["program_startup"] == pytest.approx(1)  # 30–31, step 3 ran 31–36
    assert report.productive_s == pytest.approx(15)
    assert report.failures[0].repair_s == pytest.approx(26)


def test_a_rollback_without_new_steps_throws_work_away() -> None:
    events: list[schemas.Event] = [started(0, 0, 1)]
    events += step(2, 1, 2.0, 1) + step(4, 2, 2.0, 1) + step(6, 3, 2.0, 1)
    events.append(
        schemas.CheckpointRestored(
            job=JOB, ts=at(9), node="n0", rank=0, step=1, tier="object_store", duration_s=2.0
        )
    )
    report = compute_goodput(events)
    assert report.productive_s == pytest.approx(2)  # only step 1 survives the rollback
    assert report.badput["wasted_progress"] == pytest.approx(4)
    assert report.badput["checkpoint_restore"] == pytest.approx(2)
    assert report.badput["job_down"] == pytest.approx(1)


def _evicted_at_its_flag(flag_s: float | None) -> list[schemas.Event]:
    """Two ranks step at 1 s (steps 1-10, done at 10), then at 3 s behind a straggler (steps
    11-15, done at 25); the straggler is flagged at ``flag_s`` (None: never, as in a run
    without goodput) and evicted: both ranks stop at 26 and start again at 27, then step at
    1 s (steps 16-25)."""
    events: list[schemas.Event] = [started(0, 0, 2), started(0, 1, 2)]
    for number in range(1, 11):
        events += step(number, number, 1.0, 2)
    for number in range(11, 16):
        events += step(10 + 3 * (number - 10), number, 3.0, 2)
    if flag_s is not None:
        flag = schemas.Signal(
            job=JOB, ts=at(flag_s), signal="straggler", node="n1", severity="info"
        )
        decision = schemas.Decision(
            job=JOB,
            ts=at(flag_s + 0.01),
            signal_id=flag.signal_id,
            policy="p",
            rule="evict-straggler-hot-swap",
            reason="slow",
            command_ids=["swap"],
        )
        events += [flag, decision]
    events.append(
        schemas.CheckpointSaved(
            job=JOB, ts=at(25.5), node="n0", rank=0, step=15, stall_s=0.0, bytes=1
        )
    )
    for rank in (0, 1):
        events.append(
            schemas.RankExited(
                job=JOB, ts=at(26), node=f"n{rank}", rank=rank, pid=100 + rank, exit_code=0,
                expected_reason="hot_swap",
            )
        )  # fmt: skip
    events += [started(27, 0, 2), started(27, 1, 2)]
    for number in range(16, 26):
        events += step(27 + (number - 15), number, 1.0, 2)
    return events


@pytest.mark.parametrize(
    "flag_s", [None, 13.5, 24.5, 25.2], ids=["unflagged", "early", "late", "evicted-at-once"]
)
def test_slow_steps_are_charged_from_their_onset_flagged_or_not(flag_s: float | None) -> None:
    """Steps 11-15 ran 3 s against a 1 s healthy median (20 of the 25 steps): 5 x 2 s = 10 s
    of straggler slowdown, whenever the flag came. Charging only the steps after the flag once
    gave 4 s (flag at 13.5), 0 s (at 24.5: the last slow step ended after it, at 25, so 2 s)
    and 0 s (evicted at once, or never flagged, the baseline's case)."""
    report = compute_goodput(_evicted_at_its_flag(flag_s))
    assert report.healthy_step_time_s == {2: pytest.approx(1.0)}
    assert report.badput["straggler_slowdown"] == pytest.approx(10.0, abs=1e-6)
    assert report.productive_s == pytest.approx(25.0, abs=1e-6)  # 25 steps x 1 s


def test_a_median_most_steps_exceed_is_noted() -> None:
    """When most steps ran slow the median is slow itself: the report says so."""
    events: list[schemas.Event] = [started(0, 0, 1)]
    for number in range(1, 4):
        events += step(number, number, 1.0, 1)
    for number in range(4, 8):
        events += step(3 + 3 * (number - 3), number, 3.0, 1)
    report = compute_goodput(events)
    assert any("may have run slow" in note for note in report.notes)


def test_several_jobs_need_a_choice() -> None:
    other = [msgspec.structs.replace(e, job="other") for e in scenario_events()]
    with pytest.raises(ValueError, match="several jobs"):
        compute_goodput(scenario_events() + other)
    chosen = compute_goodput(scenario_events() + other, job=JOB)
    assert chosen.total_s == pytest.approx(EXPECTED_TOTAL)
    with pytest.raises(ValueError, match="no events for job"):
        compute_goodput(scenario_events(), job="missing")


def test_no_training_events_is_an_error() -> None:
    with pytest.raises(ValueError, match="no events"):
        compute_goodput([])
    with pytest.raises(ValueError, match="no training events"):
        compute_goodput(
            [schemas.HostHealth(job=JOB, ts=at(1), node="n0", healthy=True, gpu_available=True)]
        )


def test_job_without_steps_is_all_badput() -> None:
    events = [
        started(0, 0, 1),
        schemas.RankExited(job=JOB, ts=at(8), node="n0", rank=0, pid=1, exit_code=3),
    ]
    report = compute_goodput(events)
    assert report.productive_s == 0 and report.goodput_pct == 0
    assert report.total_s == pytest.approx(8)
    assert any("no StepDone" in note for note in report.notes)


def test_a_checkpoint_tier_filling_a_volume_is_not_a_training_restore() -> None:
    """The replicator reports its RestoreToNode work with rank -1; training did not go back."""
    from goodput import schemas
    from goodput.measure.accounting import compute_goodput
    from tests.accounting.scenario import at, scenario_events

    events = scenario_events()
    tier_restore = schemas.CheckpointRestored(
        job=events[0].job,
        ts=at(30.0),
        node="node-9",
        rank=-1,
        step=1,
        tier="peer",
        duration_s=0.5,
        bytes=10,
    )
    assert compute_goodput([*events, tier_restore]) == compute_goodput(events)
