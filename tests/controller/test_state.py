"""JobState: construction, effects of commands, idempotence, storage round trip."""

from __future__ import annotations

import msgspec
import pytest

from goodput import schemas
from goodput.supervisor.jobstate.folds import (
    apply_command,
    new_job_state,
    observe_event,
    observe_signal,
    record_checkpoint,
    record_step_time,
)
from goodput.supervisor.jobstate.model import decode_state, encode_state

from .helpers import JOB, T0, at, job, signal


def test_new_state_needs_whole_replicas() -> None:
    state = job(active=6, spares=1, per_dp=2)
    assert (state.num_dp_replicas, state.target_dp_replicas, state.world_size) == (3, 3, 48)
    assert state.spares == ["s0"]
    with pytest.raises(ValueError, match="whole replicas"):
        new_job_state(JOB, ["a", "b", "c"], num_nodes_per_dp=2)
    with pytest.raises(ValueError, match="unique"):
        new_job_state(JOB, ["a", "a"], num_nodes_per_dp=1)


def test_hot_swap_puts_the_spare_in_the_failed_nodes_place() -> None:
    state = job(active=4, spares=1)
    swap = schemas.HotSwap(job=JOB, failed_node="n1", spare_node="s0")
    after = apply_command(state, swap, at(1), cause="degraded_host")
    assert after.active == ["n0", "s0", "n2", "n3"]
    assert after.role_of("n1") == "failed"
    assert [(r.action, r.signal) for r in after.restarts] == [("hot_swap", "degraded_host")]
    assert state.active == ["n0", "n1", "n2", "n3"]  # the input is untouched
    assert apply_command(after, swap, at(2)) is after  # applied once, by id


def test_scale_to_down_and_up() -> None:
    state = job(active=6)
    down = schemas.ScaleTo(
        job=JOB, num_dp_replicas=2, nodes=["n0", "n2", "n3", "n4"], drop_nodes=["n1"]
    )
    state = apply_command(state, down, at(1))
    assert state.num_dp_replicas == 2 and state.active == ["n0", "n2", "n3", "n4"]
    assert state.role_of("n1") == "failed" and state.spares == ["n5"]
    state = observe_signal(state, signal("node_returned", "n1", "info"), at(2))
    assert state.role_of("n1") == "failed"  # until the actuator takes it back
    state = apply_command(state, schemas.ReturnNode(job=JOB, node="n1"), at(2))
    assert state.spares == ["n1", "n5"]
    up = schemas.ScaleTo(job=JOB, num_dp_replicas=3, nodes=[*state.active, "n1", "n5"])
    state = apply_command(state, up, at(3))
    assert state.num_dp_replicas == 3 and state.world_size == 48


def test_signals_count_failures_and_interruptions_once() -> None:
    state = job()
    crash = signal("crash", "n2", observed_ts=at(5))
    state = observe_signal(state, crash, at(5))
    assert state.node("n2").failures == 1 and state.interruptions == [at(5)]
    assert crash.signal_id in state.handled_signal_ids
    straggler = observe_signal(state, signal("straggler", "n3", "info"), at(6))
    assert straggler.interruptions == state.interruptions


def test_checkpoint_cost_and_step_time_are_recorded() -> None:
    state = job()
    for step, stall in ((100, 2.0), (100, 9.0), (200, 4.0)):
        saved = schemas.CheckpointSaved(
            job=JOB, node="n0", rank=0, step=step, stall_s=stall, bytes=1
        )
        state = record_checkpoint(state, saved, at(step))
    persisted = schemas.CheckpointPersisted(
        job=JOB, node="n0", rank=0, step=200, path="/x", bytes=1, duration_s=12.0
    )
    state = record_checkpoint(state, persisted, at(201))
    assert state.checkpoint_cost_s == pytest.approx(3.0)
    assert state.checkpoints[-1].persist_s == 12.0 and state.last_checkpoint_step == 200
    for _ in range(200):
        state = record_step_time(state, 2.0)
    assert state.step_time_s == pytest.approx(2.0)


def test_state_round_trips_and_rejects_garbage() -> None:
    state = observe_signal(job(spares=1), signal("crash", "n1"), T0)
    assert decode_state(encode_state(state)) == state
    with pytest.raises(schemas.SchemaError):
        decode_state(b"\x81\xa3job\x01")
    with pytest.raises(schemas.SchemaError):
        decode_state(b"not msgpack at all \xff")


def test_one_fold_takes_every_event_the_controller_learns_from() -> None:
    """``observe_event``: what the controller service and the simulator both fold a job's
    events with — the actuator's membership, rank 0's steps and loop, rank 0's checkpoints;
    any other event (another rank's step, a signal) leaves the state as it was."""
    state = job(active=2, spares=1, per_dp=1)
    status = schemas.JobStatus(
        job=JOB, state="running", attempt=2, world_size=16, procs_per_node=8,
        active_nodes=["n0", "s0"], spare_nodes=[], failed_nodes=["n1"],
    )  # fmt: skip
    observed = observe_event(state, status, at(1))
    assert observed.active == ["n0", "s0"] and observed.role_of("n1") == "failed"
    step = schemas.StepDone(
        job=JOB, node="n0", rank=0, step=5, step_time_s=0.5, tokens=1, loss=1.0,
        in_process_restart=True,
    )  # fmt: skip
    stepped = observe_event(observed, step, at(2))
    assert stepped.recent_step_times_s[-1] == 0.5 and stepped.in_process_restart is True
    other_rank = msgspec.structs.replace(step, rank=1, node="s0", step_time_s=9.0)
    assert observe_event(stepped, other_rank, at(3)) is stepped
    saved = schemas.CheckpointSaved(job=JOB, node="n0", rank=0, step=5, stall_s=0.2, bytes=10)
    assert observe_event(stepped, saved, at(4)).checkpoints[-1].stall_s == 0.2
    assert observe_event(stepped, signal("crash", "n0"), at(5)) is stepped
