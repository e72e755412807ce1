"""The simulated actuator: executes the controller's commands on a simulated cluster with the
actuator's membership rules (:mod:`goodput.membership`), taking the profile's time for each.

Commands run one after the other, as the real actuator's consumer runs them. A restarting
command (restart, hot swap, scale) stops the worker group and relaunches it; the relaunch is
reported back to the world, which restores and resumes training. A replayed run's
remediations cost what the run measured for each (:class:`MeasuredCosts`). An in-process
restart (``RestartInProcess``) is run as a restart: without a measured time for it, it costs
what a cold restart costs, since a profile has no warm-restart figures; the simulated figure
is then pessimistic for it. A command the membership
rules refuse is answered with a failed ``ActionResult``, as the real actuator answers it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from goodput import schemas
from goodput.membership import Membership, MembershipError
from goodput.policy.state import ACTUATOR_COMMANDS
from goodput.simulate.profile import RestartCosts
from goodput.simulate.records import MeasuredCosts, RemediationCost

NS = 1_000_000_000


@dataclass(frozen=True, slots=True)
class Execution:
    """What one command did: its result, the membership after it, and whether it relaunched."""

    command: schemas.Command
    started_ns: int
    done_ns: int
    result: schemas.ActionResult
    membership: Membership
    relaunch: bool
    stopped: bool = False
    #: a replay: what the run measured for this remediation
    cost: RemediationCost | None = None

    @property
    def stops_ns(self) -> int:
        """When the old worker group stops: at once, or as late as the replayed run's did
        (a scale-up trains on until its new ranks are ready)."""
        trained_on = self.cost.trained_on_s if self.cost is not None else 0.0
        return self.started_ns + int(trained_on * NS)


class SimActuator:
    def __init__(
        self,
        job: str,
        membership: Membership,
        costs: RestartCosts,
        measured: MeasuredCosts | None = None,
    ):
        """``measured``: a replayed run's remediation costs (they replace the profile's)."""
        self.measured = measured
        self.job = job
        self.membership = membership
        self.costs = costs
        self.attempt = 1
        self._free_at = 0

    def execute(self, command: schemas.Command, now: int) -> Execution | None:
        """Run ``command`` (None: not the actuator's); the execution ends at ``done_ns``."""
        if not isinstance(command, ACTUATOR_COMMANDS):
            return None
        start = max(now, self._free_at)
        action = schemas.kind_of(type(command))
        try:
            after = self.membership.after(command)
        except MembershipError as exc:
            return self._answer(command, start, start, False, str(exc), relaunch=False)
        c = self.costs
        if isinstance(command, schemas.ReturnNode):
            self.membership = after
            return self._answer(command, start, start, True, "returned", relaunch=False)
        if isinstance(command, schemas.Stop):
            return self._answer(
                command, start, start + int(c.stop_s * NS), True, "stopped", relaunch=False
            )
        seconds = c.stop_s + c.launch_s
        if isinstance(command, schemas.HotSwap):
            seconds += c.hot_swap_provision_s
        if isinstance(command, schemas.Restart) and command.reset_gpus:
            seconds += c.gpu_reset_s
        cost = self.measured.next(action) if self.measured is not None else None
        if cost is not None:
            seconds = cost.relaunch_s
        self.membership = after
        self.attempt += 1
        done = start + int(seconds * NS)
        execution = self._answer(command, start, done, True, f"{action} done", relaunch=True)
        return dataclasses.replace(execution, cost=cost)

    def _answer(
        self,
        command: schemas.Command,
        start: int,
        done: int,
        ok: bool,
        detail: str,
        *,
        relaunch: bool,
    ) -> Execution:
        self._free_at = done
        result = schemas.ActionResult(
            job=self.job,
            ts=done,
            command_id=command.command_id,
            action=schemas.kind_of(type(command)),
            ok=ok,
            detail=detail,
            duration_s=(done - start) / NS,
        )
        stopped = ok and isinstance(command, schemas.Stop) and not command.nodes
        return Execution(command, start, done, result, self.membership, relaunch, stopped)

    def status(self, now: int, state: str = "running") -> schemas.JobStatus:
        m = self.membership
        return schemas.JobStatus(
            job=self.job,
            ts=now,
            state=state,  # type: ignore[arg-type]
            attempt=self.attempt,
            world_size=m.world_size,
            procs_per_node=m.procs_per_node,
            active_nodes=list(m.active),
            spare_nodes=list(m.spares),
            failed_nodes=list(m.failed),
        )
