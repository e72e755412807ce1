"""The simulated actuator: executes the controller's commands on a simulated cluster with the
actuator's membership rules (:mod:`goodput.supervisor.membership`), taking the profile's time for each.

Commands run one after the other, as the real actuator's consumer runs them. A restarting
command (restart, hot swap, scale) stops the worker group and relaunches it; the relaunch is
reported back to the world, which restores and resumes training. A replayed run's
remediations cost what the run measured for each (:class:`MeasuredCosts`).

The warm path follows the real backend's (``Backend.restart_in_process``): a
``RestartInProcess`` keeps the surviving ranks' processes (they rejoin, ``rejoin_s``, and
restore from host memory), and starts the dead ranks again — from their node's ready standby
with ``standbys`` (warm: ``warm_startup_s``), else cold (``launch_s`` and ``startup_s``: the
survivors wait for it). It is refused when no rank is alive, and fails — every rank stopped,
the controller then decides a cold restart — when a dead rank's node cannot start it (broken)
or a live rank cannot rejoin (its node broke). Standbys (``standbys_per_node``, spares
included) are ready ``standby_ready_s`` after the job starts or after one is taken; a
launch is warm only when every rank it starts is a ready standby (then it costs the stop and
the rendezvous, ``rejoin_s``, and the warm start-up; one standby per node and eight ranks per
node: a whole-group launch stays cold, as it does for real). A command the
membership rules refuse is answered with a failed ``ActionResult``, as the real actuator
answers it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from goodput import schemas
from goodput.supervisor.membership import Membership, MembershipError
from goodput.tools.simulate.profile import RestartCosts
from goodput.tools.simulate.records import MeasuredCosts, RemediationCost

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
    #: the ranks it started were ready standbys or survivors: start-up is the warm one
    warm: bool = False
    #: an in-process restart: the survivors restore from host memory
    in_process: bool = False
    #: a failed in-process restart: every rank was stopped
    killed: bool = False
    #: when the standbys it took are ready again (None: it took none)
    standbys_ready_ns: int | None = None

    @property
    def rollback_bound(self) -> int | None:
        """A numerical rollback's newest step to restore: the one before its fault (None: not
        a rollback)."""
        before = getattr(self.command, "restore_before_step", None)
        return None if before is None else before - 1

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
        *,
        standbys_per_node: int = 0,
        start_ns: int = 0,
    ):
        """``measured``: a replayed run's remediation costs (they replace the profile's);
        ``standbys_per_node``: ready standbys kept on every node, spares included, the first
        ready ``standby_ready_s`` after ``start_ns``."""
        self.measured = measured
        self.job = job
        self.membership = membership
        self.costs = costs
        self.attempt = 1
        self._free_at = 0
        self.standbys_per_node = standbys_per_node
        first = start_ns + int(costs.standby_ready_s * NS)
        #: when each node's standbys are ready (only where the job keeps standbys)
        self.ready_at: dict[str, int] = (
            dict.fromkeys([*membership.active, *membership.spares], first)
            if standbys_per_node
            else {}
        )
        #: nodes with a dead rank of this attempt (the world reports a crash)
        self.dead: set[str] = set()
        #: nodes that cannot run a rank (the world's broken nodes)
        self.broken: Mapping[str, str] = {}

    def execute(self, command: schemas.Command, now: int) -> Execution | None:
        """Run ``command`` (None: not the actuator's); the execution ends at ``done_ns``."""
        if command.executor != "actuator":
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
        if isinstance(command, schemas.RestartInProcess):
            return self._in_process(command, start)
        if not command.restarts_group:  # the rest relaunch the worker group
            return self._answer(
                command, start, start, False, f"the simulator does not run {action}",
                relaunch=False,
            )  # fmt: skip
        launched = list(after.active)
        warm = self._warm(launched, start, after.procs_per_node)
        # every rank a ready standby: no process to schedule or start (a spare's standbys
        # are up, so it is provisioned), only the new rendezvous
        seconds = c.stop_s + (c.rejoin_s if warm else c.launch_s)
        if isinstance(command, schemas.HotSwap) and not warm:
            seconds += c.hot_swap_provision_s
        if isinstance(command, schemas.Restart) and command.reset_gpus:
            seconds += c.gpu_reset_s
        cost = self.measured.next(action) if self.measured is not None else None
        if cost is not None:
            seconds = cost.relaunch_s
        self.membership = after
        self.attempt += 1
        self.dead.clear()
        done = start + int(seconds * NS)
        taken = launched if getattr(command, "standbys", False) else []
        if isinstance(command, schemas.Restart):
            taken += list(command.reset_gpus)  # a reset node's standbys are stopped for it
        execution = self._answer(command, start, done, True, f"{action} done", relaunch=True)
        return dataclasses.replace(
            execution, cost=cost, warm=warm, standbys_ready_ns=self._take(taken, start, done)
        )

    def _in_process(self, command: schemas.RestartInProcess, start: int) -> Execution:
        """The real backend's warm restart: survivors rejoin, the dead ranks start again."""
        c = self.costs
        active = self.membership.active
        if self.dead >= set(active):
            return self._answer(
                command, start, start, False, "no rank is alive to restart in process",
                relaunch=False,
            )  # fmt: skip
        dead = [n for n in active if n in self.dead]
        stuck = [n for n in active if n in self.broken and n not in self.dead]
        unstartable = [n for n in dead if n in self.broken]
        if stuck or unstartable:
            why = (
                f"dead ranks not started again: {', '.join(unstartable)} down"
                if unstartable
                else f"{len(stuck)} rank(s) did not rejoin within {command.deadline_s:g} s"
            )
            wait = c.launch_s if unstartable else command.deadline_s
            self.attempt += 1
            failed = self._answer(
                command, start, start + int(wait * NS), False,
                f"in-process restart failed: {why}", relaunch=False,
            )  # fmt: skip
            return dataclasses.replace(failed, killed=True)
        # a crash lost one rank of its node (the one the world stands for the node by)
        warm = self._warm(dead, start, 1) if command.standbys else not dead
        seconds = c.rejoin_s if warm else c.launch_s
        cost = (
            self.measured.next(schemas.kind_of(type(command)))
            if self.measured is not None
            else None
        )
        if cost is not None:
            seconds = cost.relaunch_s
        self.attempt += 1
        self.dead.clear()
        done = start + int(seconds * NS)
        execution = self._answer(
            command, start, done, True,
            f"{len(active) - len(dead)} node(s) restarted in process, {len(dead)} started again",
            relaunch=True,
        )  # fmt: skip
        ready = self._take(dead, start, done) if command.standbys else None
        return dataclasses.replace(
            execution, cost=cost, warm=warm, in_process=True, standbys_ready_ns=ready
        )

    def _warm(self, nodes: list[str], now: int, ranks_per_node: int) -> bool:
        """Whether every rank started on ``nodes`` (``ranks_per_node`` each) is a ready
        standby; none started is warm."""
        if not nodes:
            return True
        return self.standbys_per_node >= ranks_per_node and all(
            self.ready_at.get(n, now + 1) <= now for n in nodes
        )

    def _take(self, nodes: list[str], now: int, done: int) -> int | None:
        """The ready standbys of ``nodes`` are taken; their successors are ready later."""
        taken = [n for n in nodes if n in self.ready_at and self.ready_at[n] <= now]
        if not taken:
            return None
        ready = done + int(self.costs.standby_ready_s * NS)
        for node in taken:
            self.ready_at[node] = ready
        return ready

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

    def status(self, now: int, state: schemas.JobStateName = "running") -> schemas.JobStatus:
        m = self.membership
        # a set: list membership made this quadratic (0.3 s per status at 2,080 nodes)
        held = {*m.active, *m.spares}
        return schemas.JobStatus(
            job=self.job,
            ts=now,
            state=state,
            attempt=self.attempt,
            world_size=m.world_size,
            procs_per_node=m.procs_per_node,
            active_nodes=list(m.active),
            spare_nodes=list(m.spares),
            failed_nodes=list(m.failed),
            standbys={
                n: [0] * self.standbys_per_node
                for n, ready in self.ready_at.items()
                if ready <= now and n in held
            },
        )
