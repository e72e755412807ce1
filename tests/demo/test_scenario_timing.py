"""The full demo's remediations must not depend on how fast the machine trains.

``play`` walks the scenario step by step on a simulated clock and feeds the signals the sensor
raises into the real controller with its built-in policy; repairs come when the scenario's
``DemoFault.repair_due`` says so, as in the demo's driver. Every command goes through the
actuator's membership rules, which refuse one the actuator could not carry out (a refused hot
swap left the loaded demo's job dead until ``job_down`` restarted it whole). A node loss reaches
the sensor either way round: the killed ranks' exit (a correctable crash) first, common under
load, or the host monitor's fault first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgspec
import pytest

from goodput import schemas
from goodput.config import load_service_config
from goodput.supervisor.control.engine import Controller, ControllerSettings, Outcome
from goodput.supervisor.jobstate.folds import new_job_state, observe_status
from goodput.supervisor.jobstate.model import JobState
from goodput.supervisor.membership import Membership, MembershipError
from goodput.tools.demo.scenarios import SCENARIOS, DemoFault, DemoScenario
from goodput.tools.demo.session import service_flags

NS = 1_000_000_000
STEPS = 800


def demo_controller() -> Controller:
    """The controller with the settings ``goodput demo`` gives it (compressed crash loops)."""
    config = load_service_config("controller", service_flags("goodput")["controller"])
    return Controller(settings=msgspec.convert(config.options["settings"], ControllerSettings))


@dataclass
class Run:
    state: JobState
    #: the actuator's view, moved by the commands as the actuator applies them
    membership: Membership
    controller: Controller = field(default_factory=demo_controller)
    now_s: float = 0.0
    rules: list[str] = field(default_factory=list)

    def signal(self, kind: str, node: str, severity: str) -> None:
        sig = schemas.Signal(job="demo", signal=kind, node=node, severity=severity, detail="sim")
        self._take(self.controller.handle(self.state, sig, self.now_ns))

    def tick(self, seconds: float) -> None:
        """Let time pass; back-offs that were served are decided."""
        self.now_s += seconds
        for outcome in self.controller.due(self.state, self.now_ns):
            self._take(outcome)

    @property
    def now_ns(self) -> int:
        return int(self.now_s * NS)

    def _take(self, outcome: Outcome) -> None:
        """Apply the decision's commands as the actuator would, and fold its answers back."""
        self.state = outcome.state
        if outcome.decision is not None:
            self.rules.append(outcome.decision.rule)
        for command in outcome.commands:
            ok, detail = True, ""
            try:
                match command:
                    case schemas.HotSwap():
                        self.membership, _ = self.membership.hot_swap(
                            command.failed_node, command.spare_node
                        )
                    case schemas.ScaleTo():
                        self.membership = self.membership.scale_to(
                            command.nodes, command.drop_nodes
                        )
                    case schemas.ReturnNode():
                        self.membership = self.membership.return_node(command.node)
            except MembershipError as exc:
                ok, detail = False, str(exc)
            result = schemas.ActionResult(
                job="demo",
                command_id=command.command_id,
                action=schemas.kind_of(type(command)),
                ok=ok,
                detail=detail,
            )
            self._take(self.controller.settle(self.state, result, self.now_ns))
        status = schemas.JobStatus(
            job="demo",
            state="running",
            attempt=self.state.attempt + 1,
            world_size=self.membership.world_size,
            procs_per_node=self.membership.procs_per_node,
            active_nodes=self.membership.active,
            spare_nodes=self.membership.spares,
            failed_nodes=self.membership.failed,
        )
        self.state = observe_status(self.state, status, self.now_ns)
        if not self.state.pending:  # the view is the actuator's once every command is answered
            assert self.membership.active == self.state.active


#: the signals each fault raises; a node loss either way round, as the sensor may see it
SIGNALS = {
    "kill-rank": [("crash", "correctable")],
    "hang-rank": [("hang", "correctable")],
    "slow-rank": [("straggler", "info")],
    "sdc": [("replica_mismatch", "correctable")],
}
#: faults whose signal names no node: two replicas that disagree hold no majority
NODELESS = {"sdc"}
NODE_LOSS = {
    # the killed ranks' exit reported before the host monitor's fault (common under load)
    "crash-first": [("crash", "correctable"), ("degraded_host", "uncorrectable")],
    "host-first": [("degraded_host", "uncorrectable"), ("crash", "correctable")],
}
#: decisions that change what runs where (or give up on the job)
MEMBERSHIP = {
    "evict-straggler-hot-swap",
    "evict-straggler-scale-down",
    "hot-swap",
    "repeat-offender",
    "scale-down",
    "scale-up",
    "restart-job",
    "no-capacity",
    "crash-loop-give-up",
}
SPEEDS = [(0.1, 5.0), (0.3, 10.0), (1.0, 30.0), (3.0, 90.0)]
SPEED_IDS = ["idle", "busy", "loaded", "overloaded"]


def play(scenario: DemoScenario, *, step_s: float, recover_s: float, loss: str) -> list[str]:
    """The decision rules, in order, for a job training at ``step_s`` per step."""
    nodes = [f"node-{i}" for i in range(2 + scenario.spares)]
    run = Run(
        new_job_state("demo", nodes[:2], num_nodes_per_dp=1, spares=nodes[2:]),
        Membership.initial(2, scenario.spares, 1),
    )
    down: list[tuple[DemoFault, str, float]] = []
    faults = list(scenario.faults)
    for step in range(STEPS):
        run.tick(step_s)
        for fault, node, failed_at in list(down):
            due = fault.repair_due(
                down_s=run.now_s - failed_at, step=step, steps=STEPS, job_waits=False
            )
            if due:
                down.remove((fault, node, failed_at))
                run.signal("node_returned", node, "info")
        if faults and step >= faults[0].at * STEPS:
            fault = faults.pop(0)
            node = run.state.active[fault.rank]
            for kind, severity in SIGNALS.get(fault.action) or NODE_LOSS[loss]:
                run.signal(kind, "" if fault.action in NODELESS else node, severity)
            if fault.action == "fail-node" and fault.repair_after_s:
                down.append((fault, node, run.now_s))
            if fault.action != "slow-rank":
                run.tick(recover_s)  # the remediation: stop, restore, relaunch, first step
    return [rule for rule in run.rules if rule != "checkpoint-interval"]


@pytest.mark.parametrize("loss", sorted(NODE_LOSS))
@pytest.mark.parametrize(("step_s", "recover_s"), SPEEDS, ids=SPEED_IDS)
def test_the_full_scenario_remediates_the_same_at_any_speed(
    step_s: float, recover_s: float, loss: str
) -> None:
    rules = play(SCENARIOS["full"], step_s=step_s, recover_s=recover_s, loss=loss)
    assert [rule for rule in rules if rule in MEMBERSHIP] == [
        "evict-straggler-hot-swap",
        "hot-swap",  # the first node lost, a spare free
        "scale-down",  # the second lost: the first is not back yet, no spare free
        "scale-up",  # the second is back
    ], rules
    # the crash, the hang, the SDC
    assert rules[:3] == ["in-process-restart", "in-process-restart", "numerical-rollback"], rules


@pytest.mark.parametrize("loss", sorted(NODE_LOSS))
@pytest.mark.parametrize(("step_s", "recover_s"), SPEEDS, ids=SPEED_IDS)
def test_the_scale_down_up_scenario_remediates_the_same_at_any_speed(
    step_s: float, recover_s: float, loss: str
) -> None:
    rules = play(SCENARIOS["scale-down-up"], step_s=step_s, recover_s=recover_s, loss=loss)
    assert [rule for rule in rules if rule in MEMBERSHIP] == ["scale-down", "scale-up"], rules


def test_a_job_that_goes_on_without_its_node_gets_it_back_at_a_training_step() -> None:
    fault = DemoFault(0.5, "fail-node", rank=0, repair_after_s=45.0, repair_at=0.8)
    assert not fault.repair_due(down_s=500.0, step=639, steps=800, job_waits=False)
    assert fault.repair_due(down_s=1.0, step=640, steps=800, job_waits=False)


def test_a_job_that_waits_for_its_node_gets_it_on_the_wall_clock() -> None:
    fault = DemoFault(0.5, "fail-node", rank=0, repair_after_s=45.0, repair_at=0.8)
    assert not fault.repair_due(down_s=44.0, step=400, steps=800, job_waits=True)
    assert fault.repair_due(down_s=45.0, step=400, steps=800, job_waits=True)
    wall_only = DemoFault(0.5, "fail-node", rank=0, repair_after_s=45.0)
    assert not wall_only.repair_due(down_s=44.0, step=800, steps=800, job_waits=False)
    assert wall_only.repair_due(down_s=45.0, step=0, steps=800, job_waits=False)


def test_a_node_without_repair_never_comes_back() -> None:
    fault = DemoFault(0.35, "fail-node", rank=1, repair_at=0.5)
    assert not fault.repair_due(down_s=1e9, step=800, steps=800, job_waits=True)
    assert not fault.repair_due(down_s=1e9, step=800, steps=800, job_waits=False)
