"""Young's checkpoint interval and the SetCheckpointInterval recommendation."""

from __future__ import annotations

import math

import msgspec
import pytest

from goodput import schemas
from goodput.supervisor.control.checkpoint_interval import (
    IntervalSettings,
    observed_mtbf_s,
    young_interval_s,
)
from goodput.supervisor.control.engine import Controller
from goodput.supervisor.jobstate.folds import (
    STEP_TIME_WINDOW,
    observe_signal,
    record_checkpoint,
    record_step_time,
)

from .helpers import JOB, at, job, signal


def test_young_values() -> None:
    assert young_interval_s(30, 86_400) == pytest.approx(2276.84, abs=0.01)
    assert young_interval_s(2, 3600) == pytest.approx(120.0)
    assert young_interval_s(0, 3600) == 0
    assert young_interval_s(8, 4 * 3600) == pytest.approx(math.sqrt(2 * 8 * 4 * 3600))
    with pytest.raises(ValueError):
        young_interval_s(1, 0)


def test_mtbf_from_observed_interruptions_with_a_prior() -> None:
    state = job()
    assert observed_mtbf_s(state, at(0), 86_400) == 86_400
    for hour in (1, 2, 3):
        state = observe_signal(state, signal("crash", "n0", observed_ts=at(hour * 3600)), at(0))
    # 4 h run + 24 h prior over 3 + 1 failures
    assert observed_mtbf_s(state, at(4 * 3600), 86_400) == pytest.approx(7 * 3600)


def _measured(stall_s: float = 2.0, step_s: float = 0.5, persist_s: float = 5.0):
    state = record_step_time(job(), step_s)
    saved = schemas.CheckpointSaved(job=JOB, node="n0", rank=0, step=10, stall_s=stall_s, bytes=1)
    state = record_checkpoint(state, saved, at(10))
    persisted = schemas.CheckpointPersisted(
        job=JOB, node="n0", rank=0, step=10, path="p", bytes=1, duration_s=persist_s
    )
    return record_checkpoint(state, persisted, at(20))


def test_recommendation_follows_young_and_is_sticky() -> None:
    controller = Controller()
    state = _measured(stall_s=2.0, step_s=0.5)
    # 1 h run, one failure: MTBF = (3600 + 86400) / 2 = 45000 s → sqrt(2·2·45000) = 424.3 s
    state = observe_signal(state, signal("crash", "n0", observed_ts=at(1800)), at(1800))
    outcome = controller.recommend_checkpoint_interval(state, at(3600))
    (command,) = outcome.commands
    assert isinstance(command, schemas.SetCheckpointInterval)
    assert command.every_steps == round(math.sqrt(2 * 2.0 * 45_000) / 0.5)
    assert "Young" in command.rationale and outcome.decision.rule == "checkpoint-interval"
    assert outcome.state.checkpoint_interval_steps == command.every_steps
    # barely changed a minute later: no new command
    assert controller.recommend_checkpoint_interval(outcome.state, at(3660)).commands == []


def test_interval_never_below_the_time_to_persist() -> None:
    state = _measured(stall_s=0.01, step_s=1.0, persist_s=120.0)
    outcome = Controller().recommend_checkpoint_interval(state, at(60))
    assert outcome.commands[0].every_steps == 120
    assert "persist" in outcome.commands[0].rationale


def test_nothing_to_recommend_without_measurements() -> None:
    assert Controller().recommend_checkpoint_interval(job(), at(1)).decision is None
    assert IntervalSettings().prior_mtbf_s == 86_400


def test_a_relaunch_gets_the_tuned_interval_again() -> None:
    """Ranks started again checkpoint at the launch interval until they are told the tuned one."""
    from goodput.supervisor.jobstate.folds import apply_command

    controller = Controller()
    restart = schemas.Restart(job=JOB, reason="crash")
    untuned = apply_command(job(), restart, at(10), "crash")
    done = schemas.ActionResult(
        job=JOB, command_id=restart.command_id, action="restart", ok=True, duration_s=1.0
    )
    assert controller.settle(untuned, done, at(11)).commands == []  # nothing tuned yet
    tuned = msgspec.structs.replace(untuned, checkpoint_interval_steps=40)
    outcome = controller.settle(tuned, done, at(11))
    (command,) = outcome.commands
    assert isinstance(command, schemas.SetCheckpointInterval) and command.every_steps == 40
    assert outcome.decision.rule == "checkpoint-interval"
    assert "launch interval" in outcome.decision.reason
    refused = msgspec.structs.replace(done, ok=False, detail="no node")
    assert not any(
        isinstance(c, schemas.SetCheckpointInterval)
        for c in controller.settle(tuned, refused, at(11)).commands
    )


def _interval_steps(state) -> int:
    """The interval recommended for ``state`` (none set yet, so one is always recommended)."""
    state = msgspec.structs.replace(state, checkpoint_interval_steps=0)
    (command,) = Controller().recommend_checkpoint_interval(state, at(3600)).commands
    return command.every_steps


def test_one_absurd_step_time_does_not_steer_the_interval() -> None:
    """One 1e8 s step (a stalled clock) once set a running mean to 5e6 s: every step."""
    state = _measured(step_s=0.5)
    for i in range(100):
        state = record_step_time(state, 0.5 + 0.01 * (i % 5))
    before = _interval_steps(state)
    state = record_step_time(state, 1e8)
    after = _interval_steps(state)
    assert before / 2 <= after <= before * 2, (before, after)
    assert state.step_time_s < 1.0
    for i in range(100):
        state = record_step_time(state, 0.5 + 0.01 * (i % 5))
    assert _interval_steps(state) == before


def test_the_step_time_follows_a_real_change_within_half_a_window() -> None:
    state = job()
    for _ in range(STEP_TIME_WINDOW):
        state = record_step_time(state, 0.5)
    for _ in range(STEP_TIME_WINDOW // 2 + 1):
        state = record_step_time(state, 2.0)
    assert state.step_time_s == 2.0
    assert len(state.recent_step_times_s) == STEP_TIME_WINDOW


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_a_step_time_that_is_no_duration_is_ignored(bad: float) -> None:
    state = record_step_time(job(), 0.5)
    assert record_step_time(state, bad) is state
