"""The controller folds the actuator's facts: JobStatus is the membership, ActionResult settles.

Pure: the engine and the fold functions with the clock passed in. Commands the controller
issues are replayed through the actuator's own membership rules (``goodput.supervisor.membership``) to
show that the actuator can execute them.
"""

from __future__ import annotations

from goodput import schemas
from goodput.policy import JobState
from goodput.supervisor.control.engine import Controller, ControllerSettings
from goodput.supervisor.jobstate.folds import observe_result, observe_status
from goodput.supervisor.membership import Membership

from .helpers import JOB, at, job, signal


def result(command: schemas.Command, ok: bool, detail: str = "") -> schemas.ActionResult:
    return schemas.ActionResult(
        job=JOB,
        command_id=command.command_id,
        action=schemas.kind_of(type(command)),
        ok=ok,
        detail=detail,
    )


def status(membership: Membership, attempt: int) -> schemas.JobStatus:
    return schemas.JobStatus(
        job=JOB,
        state="running",
        attempt=attempt,
        world_size=membership.world_size,
        procs_per_node=membership.procs_per_node,
        active_nodes=membership.active,
        spare_nodes=membership.spares,
        failed_nodes=membership.failed,
    )


class Actuator:
    """The actuator's membership rules applied to what the controller sends (no processes)."""

    def __init__(self, state: JobState):
        self.membership = Membership(
            active=state.active, spares=state.spares, procs_per_node=state.procs_per_node
        )
        self.attempt = 1

    def execute(self, command: schemas.Command) -> tuple[schemas.ActionResult, list]:
        """The ActionResult and the JobStatus events the real actuator would emit."""
        try:
            after = self.membership.after(command)
        except ValueError as exc:
            return result(command, False, str(exc)), []
        self.membership = after
        if isinstance(command, schemas.ReturnNode):
            return result(command, True), [status(after, self.attempt)]
        self.attempt += 1
        return result(command, True), [status(after, self.attempt)]


def run(controller: Controller, actuator: Actuator, state: JobState, outcome, now: int):
    """Execute an outcome's commands in order and fold the facts back, as the service does."""
    outcomes = [outcome]
    state = outcome.state
    for command in outcome.commands:
        answer, statuses = actuator.execute(command)
        for event in statuses:
            state = observe_status(state, event, now)
        settled = controller.settle(state, answer, now)
        state = settled.state
        if settled.decision is not None:
            outcomes.append(settled)
    return state, outcomes


def test_a_refused_hot_swap_leaves_the_node_active_and_is_decided_again() -> None:
    controller = Controller()
    swap = controller.handle(job(spares=1), signal("degraded_host", "n3", "uncorrectable"), at(1))
    (command,) = swap.commands
    assert swap.state.role_of("n3") == "failed" and [p.command for p in swap.state.pending] == [
        command
    ]
    refused = observe_result(swap.state, result(command, False, "the spare is gone"), at(2))
    # the view is what the actuator reported: n3 still active, the failed swap not counted
    assert refused.role_of("n3") == "active" and refused.spares == ["s0"]
    assert refused.restarts == [] and refused.pending == []
    again = controller.settle(swap.state, result(command, False, "the spare is gone"), at(2))
    refusal = again.state.refused[-1]
    assert (refusal.command_id, refusal.action, refusal.reason) == (
        command.command_id,
        "hot_swap",
        "the spare is gone",
    )
    assert again.decision is not None and "refused (the spare is gone)" in again.decision.reason
    assert [type(c) for c in again.commands] == [schemas.HotSwap]
    assert [r.command_id for r in again.state.restarts] == [again.commands[0].command_id]
    # refused once more: recorded, not decided a third time
    last = controller.settle(again.state, result(again.commands[0], False, "still no"), at(3))
    assert last.decision is None and last.state.pending == []
    assert len(last.state.refused) == 2 and last.state.role_of("n3") == "active"
    later = controller.handle(last.state, signal("crash", "n3"), at(4))
    assert later.decision.rule == "repeat-offender" or later.decision.rule == "in-process-restart"


def test_job_status_is_the_membership_and_pending_commands_are_predictions() -> None:
    state = job(active=4, spares=1)
    reported = Membership(active=["n0", "s0", "n2", "n3"], spares=[], failed=["n1"])
    state = observe_status(state, status(reported, 2), at(1))
    assert state.active == ["n0", "s0", "n2", "n3"] and state.role_of("n1") == "failed"
    assert state.attempt == 2 and state.spares == []


def test_a_repaired_node_is_handed_back_to_the_actuator_before_it_is_used() -> None:
    """#16 item 9: the controller made a repaired node a spare on its own, so the actuator
    refused the hot swap onto it and nothing happened until job_down fired."""
    controller = Controller()
    state = job(active=2, spares=1, per_dp=1)
    actuator = Actuator(state)
    sent: list[schemas.Command] = []
    for second, sig in enumerate(
        [
            signal("degraded_host", "n0", "uncorrectable"),
            signal("node_returned", "n0", "info"),
            signal("degraded_host", "n1", "uncorrectable"),
        ]
    ):
        outcome = controller.handle(state, sig, at(second))
        state, outcomes = run(controller, actuator, state, outcome, at(second))
        sent += [c for o in outcomes for c in o.commands]
    assert [type(c).__name__ for c in sent] == ["HotSwap", "ReturnNode", "HotSwap"]
    assert (sent[-1].failed_node, sent[-1].spare_node) == ("n1", "n0")
    assert state.refused == [] and state.pending == []
    assert actuator.membership.active == ["s0", "n0"] and state.active == ["s0", "n0"]


def test_a_failure_observed_before_the_restart_is_the_same_incident() -> None:
    """#16 item 9: one fault, one remediation. The job stalled at 8 s, a rank crashed at 10 s
    and was restarted; the job-down watchdog (no progress since 8 s) is the same incident."""
    controller = Controller()
    crash = controller.handle(job(), signal("crash", "n2", observed_ts=at(10)), at(10))
    assert crash.decision.rule == "in-process-restart"
    stalled = signal("job_down", "", "uncorrectable", observed_ts=at(8))
    same = controller.handle(crash.state, stalled, at(13))
    assert same.decision.rule == "same-incident" and same.commands == []
    # observed after the restart was issued: the new attempt's own failure, even while the
    # restart's result is still on its way
    new = controller.handle(same.state, signal("crash", "n4", observed_ts=at(10.5)), at(14))
    assert new.decision.rule == "in-process-restart"
    # an uncorrectable fault during the restart still needs the node replaced
    lost = signal("degraded_host", "n2", "uncorrectable", observed_ts=at(9))
    assert controller.handle(crash.state, lost, at(12)).decision.rule == "scale-down"


def test_an_unanswered_command_becomes_a_refusal() -> None:
    controller = Controller(settings=ControllerSettings(pending_timeout_s=60))
    swap = controller.handle(job(spares=1), signal("degraded_host", "n3", "uncorrectable"), at(1))
    assert controller.due(swap.state, at(30)) == []
    (expired,) = controller.due(swap.state, at(62))
    assert expired.state.pending == [] and expired.state.role_of("n3") == "active"
    assert "no result from the actuator within 60 s" in expired.state.refused[-1].reason


def test_a_policy_cannot_promise_a_spare_a_pending_command_took(tmp_path) -> None:
    path = tmp_path / "greedy.py"
    path.write_text(
        "from goodput import schemas\n"
        "def decide(signal, state):\n"
        "    return [schemas.HotSwap(job=state.job, failed_node=signal.node, spare_node='s0')]\n"
    )
    controller = Controller(str(path))
    first = controller.handle(job(spares=1), signal("degraded_host", "n1", "uncorrectable"), at(1))
    assert first.decision.error == ""
    second = controller.handle(first.state, signal("degraded_host", "n2", "uncorrectable"), at(2))
    assert "'s0' is not a spare" in second.decision.error
