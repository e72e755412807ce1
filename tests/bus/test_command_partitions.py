"""Each command declares its partitions (``Command.executor``, ``restarts_group``,
``issuable``) and every subset of the commands is read from them: a command type registered
with ``schemas.register`` is decoded, routed, allowed and folded with no other list edited.
The job states' live and ended sets stand beside their Literal."""

from __future__ import annotations

import typing

import msgspec
import pytest

from goodput import schemas, subjects
from goodput.schemas import commands
from goodput.supervisor.jobstate.folds import (
    apply_command,
    new_job_state,
    observe_result,
    record_step_time,
)
from goodput.supervisor.membership import Membership
from goodput.supervisor.policy import ALLOWED_COMMANDS, PolicyError
from goodput.supervisor.policy.plan import validate
from goodput.tools.simulate.actuator import SimActuator
from goodput.tools.simulate.measure import RELAUNCHING
from goodput.tools.simulate.profile import RestartCosts

NS = 1_000_000_000

#: the partitions of the commands as they were listed by hand before they were declared
#: (kind: executor, restarts the worker group, a policy may issue it)
DECLARED = {
    "checkpoint_now": ("trainer", False, True),
    "stop": ("actuator", False, True),
    "start_job": ("actuator", False, False),
    "restart": ("actuator", True, True),
    "restart_in_process": ("actuator", True, True),
    "rejoin": ("trainer", False, False),
    "hot_swap": ("actuator", True, True),
    "scale_to": ("actuator", True, True),
    "rescale": ("trainer", False, False),
    "set_ckpt_interval": ("trainer", False, True),
    "set_thresholds": ("sensor", False, False),
    "inject_fault": ("trainer", False, False),
    "restore_to_node": ("replicator", False, False),
    "reset_gpu": ("hostmon", False, False),
    "return_node": ("actuator", False, True),
    "launch_ranks": ("agent", False, False),
    "keep_standbys": ("agent", False, False),
    "signal_ranks": ("agent", False, False),
}


class FakeRelaunch(schemas.Command, tag="fake_relaunch", kw_only=True):
    """A fake remediation: the actuator relaunches the worker group, a policy may issue it."""

    executor = "actuator"
    restarts_group = True
    issuable = True

    drain_s: float = 0.0


class FakeTune(schemas.Command, tag="fake_tune", kw_only=True):
    """A fake setting a policy may send the ranks."""

    executor = "trainer"
    issuable = True

    knob: int = 1


class FakeProbe(schemas.Command, tag="fake_probe", kw_only=True):
    """A fake per-node command no policy may issue."""

    executor = "agent"

    node: schemas.Token


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """The command registry, put back after the test (``register`` extends it for good)."""
    monkeypatch.setattr(commands, "COMMAND_TYPES", commands.COMMAND_TYPES)


def _state():
    return new_job_state("job-a", ["n0", "n1"], num_nodes_per_dp=1, spares=["n2"], now=NS)


def test_the_real_commands_declare_what_the_lists_held() -> None:
    declared = {
        schemas.kind_of(t): (t.executor, t.restarts_group, t.issuable)
        for t in schemas.COMMAND_TYPES
    }
    assert declared == DECLARED
    assert [schemas.kind_of(t) for t in ALLOWED_COMMANDS] == [
        kind for kind, (_, _, issuable) in DECLARED.items() if issuable
    ]
    assert {kind for kind, (_, restarts, _) in DECLARED.items() if restarts} == RELAUNCHING


def test_declarations_are_not_on_the_wire() -> None:
    restart = schemas.Restart(job="j", nodes=["n0"])
    raw = msgspec.msgpack.decode(schemas.encode(restart))
    assert set(raw) == {"kind", *schemas.Restart.__struct_fields__}
    assert not {"executor", "restarts_group", "issuable"} & set(raw)
    assert schemas.decode_command(schemas.encode(restart)) == restart


def test_every_command_is_exported_by_its_name() -> None:
    """The package's re-exports are the one list a new command adds itself to by hand."""
    for command_type in schemas.COMMAND_TYPES:
        assert getattr(schemas, command_type.__name__) is command_type
        assert command_type.__name__ in schemas.__all__


def test_a_registered_command_is_decoded(registry: None) -> None:
    probe = FakeProbe(job="job-a", node="n1")
    with pytest.raises(schemas.SchemaError, match="Invalid value 'fake_probe'"):
        schemas.decode_command(schemas.encode(probe))
    assert schemas.register(FakeProbe) is FakeProbe
    assert schemas.decode_command(schemas.encode(probe)) == probe
    assert schemas.decode_any(schemas.encode(probe)) == probe


def test_a_command_is_routed_to_its_executor(registry: None) -> None:
    for fake in (FakeRelaunch, FakeTune, FakeProbe):
        schemas.register(fake)
    assert subjects.command_target(FakeRelaunch(job="job-a")) == subjects.ACTUATOR
    assert subjects.command_target(FakeTune(job="job-a")) == subjects.TRAINER
    assert subjects.command_target(FakeProbe(job="job-a", node="n1")) == "agent-n1"
    assert subjects.command_target(schemas.ResetGpu(job="j", node="n2", attempt=1)) == (
        subjects.node_target(subjects.HOST_MONITOR, "n2")
    )


def test_a_policy_may_issue_what_declares_it(registry: None) -> None:
    state = _state()
    relaunch, tune = FakeRelaunch(job="job-a"), FakeTune(job="job-a")
    with pytest.raises(PolicyError, match="not a command a policy may issue"):
        validate([relaunch], state, default_rule="test")  # declared, not registered
    for fake in (FakeRelaunch, FakeTune, FakeProbe):
        schemas.register(fake)
    plan = validate([relaunch, tune], state, default_rule="test")
    assert plan.commands == [relaunch, tune]
    with pytest.raises(PolicyError, match=r"FakeProbe is not .* \(.*FakeRelaunch, FakeTune\)"):
        validate([FakeProbe(job="job-a", node="n1")], state, default_rule="test")


def test_a_command_is_folded_as_it_declares(registry: None) -> None:
    schemas.register(FakeRelaunch)
    schemas.register(FakeTune)
    relaunch = FakeRelaunch(job="job-a", command_id="relaunch-1")
    state = apply_command(_state(), relaunch, 2 * NS, cause="crash")
    # the actuator's: pending until its result; a group restart: counted as one
    assert [p.command for p in state.pending] == [relaunch]
    assert [(r.action, r.signal) for r in state.restarts] == [("fake_relaunch", "crash")]
    result = schemas.ActionResult(job="job-a", command_id="relaunch-1", action="x", ok=True)
    state = observe_result(state, result, 3 * NS)
    assert state.pending == [] and state.resuming_since_ts == 2 * NS
    assert record_step_time(state, 1.0, 7 * NS).restart_downtimes_s == [5.0]
    # the trainers': sent, nothing awaited, no restart
    tuned = apply_command(state, FakeTune(job="job-a"), 8 * NS)
    assert tuned.pending == [] and tuned.restarts == state.restarts


def test_the_simulated_actuator_relaunches_what_restarts_the_group(registry: None) -> None:
    schemas.register(FakeRelaunch)
    schemas.register(FakeTune)
    costs = RestartCosts(
        stop_s=1, launch_s=2, startup_s=3, hot_swap_provision_s=4, gpu_reset_s=5,
        rejoin_s=6, warm_startup_s=7, standby_ready_s=8,
    )  # fmt: skip
    actuator = SimActuator("job-a", Membership(active=["n0"], spares=[]), costs)
    assert actuator.execute(FakeTune(job="job-a"), 0) is None
    execution = actuator.execute(FakeRelaunch(job="job-a"), 0)
    assert execution is not None and execution.relaunch and execution.result.ok
    assert execution.done_ns == 3 * NS and actuator.attempt == 2


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ({}, "declares no executor"),
        ({"executor": "nobody"}, "declares no executor"),
        ({"executor": "trainer", "restarts_group": True}, "only the actuator restarts"),
        ({"executor": "hostmon"}, "per-node hostmon names no node"),
    ],
)
def test_contradicting_declarations_are_refused(registry: None, body: dict, why: str) -> None:
    bad = type("Bad", (schemas.Command,), body, tag="fake_bad", kw_only=True)
    with pytest.raises(TypeError, match=why):
        schemas.register(bad)
    assert bad not in commands.COMMAND_TYPES


def test_a_kind_is_registered_once(registry: None) -> None:
    twin = type("Twin", (schemas.Command,), {"executor": "trainer"}, tag="restart")
    with pytest.raises(TypeError, match="kind 'restart' is taken"):
        schemas.register(twin)


def test_live_and_ended_job_states_partition_the_literal() -> None:
    states = set(typing.get_args(schemas.JobStateName))
    assert typing.get_type_hints(schemas.JobStatus)["state"] == schemas.JobStateName
    assert states == schemas.LIVE_JOB_STATES | schemas.ENDED_JOB_STATES
    assert not schemas.LIVE_JOB_STATES & schemas.ENDED_JOB_STATES
    assert {"starting", "running", "restarting"} == schemas.LIVE_JOB_STATES
