"""What the actuator service needs from a backend, and how it picks one by name.

The service only speaks this protocol, so the local backend (processes on this machine), the
agent backend (processes of node agents on other hosts) and the Kubernetes backend (one pod
per rank) are interchangeable behind the same commands.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from typing import Generic, Literal, NoReturn, Protocol, TypeVar, runtime_checkable

from goodput import schemas
from goodput.bus import Bus, BusSettings
from goodput.supervisor.membership import Membership
from goodput.telemetry import tracer
from goodput_services.actuator.ports import BusPorts, EventSink
from goodput_services.actuator.rank_environments import RankEnvironments

log = logging.getLogger(__name__)

_tracer = tracer("goodput.actuator")


@runtime_checkable
class Backend(Protocol):
    """Runs one job's worker group and reports every change as an event."""

    state: schemas.JobStateName
    attempt: int
    run_id: str
    membership: Membership | None
    ports: BusPorts
    #: how long stopping the ranks gracefully may take (SIGTERM, then SIGKILL)
    stop_grace_s: float

    async def connect_bus(self, bus: Bus) -> None: ...

    async def start_job(self, spec: schemas.StartJob) -> str: ...

    async def restart(
        self,
        reason: str,
        reset_gpus: dict[str, list[int]] | None = None,
        standbys: bool = False,
    ) -> str: ...

    async def restart_in_process(
        self, reason: str, deadline_s: float, standbys: bool = False
    ) -> str: ...

    async def hot_swap(
        self, failed: str, spare: str, reason: str, standbys: bool = False
    ) -> str: ...

    async def scale_to(
        self, nodes: list[str], drop: list[str], reason: str, standbys: bool = False
    ) -> str: ...

    async def return_node(self, node: str) -> str: ...

    def roll_back_before(self, step: int | None) -> None:
        """The next attempt's ranks restore the newest checkpoint before ``step`` (a
        numerical rollback; None: the newest)."""
        ...

    def skip_data(self, window: schemas.StepWindow) -> None:
        """Every later attempt's ranks train on no batch of ``window`` (a loss spike's)."""
        ...

    async def stop(self, reason: str) -> str: ...

    async def shutdown(self) -> None: ...

    def status(self, detail: str = "") -> schemas.JobStatus: ...

    def capabilities(self) -> schemas.BackendCapabilities:
        """What this backend can do, as every ``JobStatus`` declares it to the controller."""
        ...


class BackendRank(Protocol):
    """What the shared commands read and change of a backend's rank (a process, a pod...)."""

    rank: int
    attempt: int


RankT = TypeVar("RankT", bound=BackendRank)


class MembershipBackend(RankEnvironments, ABC, Generic[RankT]):
    """What every backend shares: its state, and the remediation commands (a membership change,
    then a relaunch).

    Membership follows :mod:`goodput.supervisor.membership`, whose refusals the service reports as failed
    ActionResults. Subclasses provide ``start_job`` (where the nodes come from), how ranks are
    started and stopped (``_launch``/``_terminate``) and where their pids are (``_pids``); the
    state every backend keeps is set here (:meth:`__init__`), their own after it.
    """

    job: str
    #: the bus as the actuator reaches it (URL, credentials, TLS)
    bus_settings: BusSettings
    ports: BusPorts
    #: ``ports.emit``: every change, as an event
    emit: EventSink
    #: the backend's name, as ``ActuatorOptions.backend`` selects it
    name: str
    #: where this backend keeps ready standby ranks (``BackendCapabilities.standbys``)
    standby_nodes: Literal["none", "spares", "all"] = "none"
    spec: schemas.StartJob | None
    membership: Membership | None
    #: the current attempt's ranks
    ranks: list[RankT]
    state: schemas.JobStateName
    attempt: int
    #: the run the attempts belong to (``StartJob.run_id``); empty before the first run
    run_id: str = ""
    _lock: asyncio.Lock

    def __init__(self, *, job: str, bus_settings: BusSettings, ports: BusPorts) -> None:
        """No job yet: stopped, no attempt, no membership, no rank."""
        self.job = job
        self.bus_settings = bus_settings
        self.ports = ports
        self.emit = ports.emit
        self.spec = None
        self.membership = None
        self.attempt = 0
        self.state = "stopped"
        self.ranks = []
        #: one command at a time changes the job
        self._lock = asyncio.Lock()

    @abstractmethod
    async def _launch(
        self, state: schemas.JobStateName, detail: str, standbys: bool = False
    ) -> None:
        """Start the worker group of a new attempt on ``self.membership`` (``standbys``: take
        ranks from the nodes' ready standbys where the backend keeps any)."""

    @abstractmethod
    async def _terminate(self, *, graceful: bool, why: str) -> None:
        """Stop every rank of the current attempt (SIGTERM-and-wait if ``graceful``)."""

    @abstractmethod
    def _pids(self) -> dict[str, list[int]]:
        """Rank process ids per node, where this machine can see them."""

    async def _gpu_holders(self, nodes: list[str]) -> dict[str, str]:
        """What of this job still runs on ``nodes`` after its ranks were stopped, by node
        (empty: nothing; a GPU reset is asked only then). Here: the rank pids still known."""
        pids = self._pids()
        return {n: "pid " + ", ".join(map(str, pids[n])) for n in nodes if pids.get(n)}

    async def connect_bus(self, bus: Bus) -> None:
        """The actuator's bus is up (a backend that drives others over it keeps it)."""
        return None

    def _standby_pids(self) -> dict[str, list[int]]:
        """Ready standby processes per node (a backend that keeps none: none)."""
        return {}

    def _suspect_nodes(self) -> list[str]:
        """Nodes that never confirmed a rank's end: no rank is placed there until they are
        replaced (a backend whose ranks' ends are always confirmed: none)."""
        return []

    async def _release_standbys(self, nodes: list[str] | None) -> None:
        """Stop the standbys of ``nodes`` (None: every one) — a backend that keeps none: no-op."""
        return None

    async def _warm_standbys(self, nodes: list[str]) -> None:
        """Have a ready standby on each of ``nodes`` before a launch there, waiting a bounded
        time — a backend that keeps none: no-op."""
        return None

    def capabilities(self) -> schemas.BackendCapabilities:
        """Membership changes (hot swap, scale) are this class's own; an in-process restart
        needs the service's bus to the trainers, a GPU reset its route to the host monitors."""
        return schemas.BackendCapabilities(
            backend=self.name,
            in_process_restart=self.ports.rejoin is not None,
            standbys=self.standby_nodes,
            gpu_reset=self.ports.reset_gpus is not None,
            hot_swap=True,
            scale=True,
        )

    def status(self, detail: str = "") -> schemas.JobStatus:
        """The job as it is now, for a JobStatus event."""
        membership = self.membership or Membership(active=[], spares=[])
        return schemas.JobStatus(
            job=self.job,
            state=self.state,
            attempt=self.attempt,
            world_size=membership.world_size,
            procs_per_node=membership.procs_per_node,
            active_nodes=list(membership.active),
            spare_nodes=list(membership.spares),
            failed_nodes=list(membership.failed),
            pids=self._pids(),
            detail=detail,
            run_id=self.run_id,
            standbys=self._standby_pids(),
            capabilities=self.capabilities(),
            suspect_nodes=self._suspect_nodes(),
        )

    async def _begin_run(self, spec: schemas.StartJob) -> None:
        """A StartJob is a new run of the job: attempts count from 1 again and ``RunStarted``
        marks where the run's history begins. Refused while a run is going (call under the
        lock): two runs of one job name would share its ranks, subjects and volumes."""
        if self.state in schemas.LIVE_JOB_STATES:
            raise RuntimeError(
                f"job {self.job} is already {self.state} (attempt {self.attempt} of run "
                f"{self.run_id}); stop it first"
            )
        self.spec, self.run_id, self.attempt = spec, spec.run_id, 0
        # a run started again (after the actuator restarted) skips what it was told to
        run_skips = self.ports.run_skips
        self.begin_skips(await run_skips(spec) if run_skips is not None else ())
        await self.emit(
            schemas.RunStarted(
                job=self.job,
                run_id=spec.run_id,
                command_id=spec.command_id,
                argv=list(spec.argv),
                nodes=spec.nodes,
                procs_per_node=spec.procs_per_node,
            )
        )

    async def restart(
        self,
        reason: str,
        reset_gpus: dict[str, list[int]] | None = None,
        standbys: bool = False,
    ) -> str:
        """Relaunch every rank; with ``reset_gpus``, those GPUs are reset while none runs."""
        async with self._lock:
            membership = self._require_job()
            reset = reset_gpus or {}
            idle = [node for node in reset if node not in membership.active]
            if idle:
                raise RuntimeError(f"GPU reset on node(s) not in the job: {', '.join(idle)}")
            await self._relaunch(
                graceful=False,
                why="gpu_reset" if reset else "restart",
                detail=reason or "in-job restart",
                reset_gpus=reset,
                standbys=standbys,
            )
            done = f"worker group restarted (attempt {self.attempt})"
            return f"GPUs of {', '.join(reset)} reset; {done}" if reset else done

    async def restart_in_process(
        self, reason: str, deadline_s: float, standbys: bool = False
    ) -> str:
        """Warm restart: the live ranks rejoin a fresh rendezvous in their processes (a
        ``Rejoin`` over the bus), the dead ones are started again into it (from a ready standby
        with ``standbys`` where the backend keeps them, else cold). A live rank that does not
        rejoin by the deadline (stuck in a native call), or a dead one that cannot be started
        again, fails the command, and every rank is stopped so that the cold restart the
        controller decides next starts from a clean slate."""
        async with self._lock:
            membership = self._require_job()
            if self.ports.rejoin is None:
                raise RuntimeError("the actuator has no bus to reach the trainers")
            live, dead = self._survivors()
            if not live:
                raise RuntimeError("no rank is alive to restart in process")
            self.state = "restarting"
            self.attempt += 1
            master_addr, master_port = self._rendezvous(live)
            command = schemas.Rejoin(
                job=self.job,
                attempt=self.attempt,
                master_addr=master_addr,
                master_port=master_port,
                world_size=membership.world_size,
                reason=reason,
            )
            answers = asyncio.ensure_future(
                self.ports.rejoin(command, {r.rank for r in live}, deadline_s)
            )
            try:
                await self._start_again(dead, master_addr, master_port, standbys)
            except Exception as exc:
                answers.cancel()
                await self._fail_in_process(f"dead ranks not started again: {exc}")
            for entry in live:
                entry.attempt = self.attempt
            failed = not_rejoined([r.rank for r in live], await answers, deadline_s)
            if failed:
                await self._fail_in_process(failed)
            self.state = "running"
            await self._report(f"in-process restart: {reason or 'in-job restart'}")
            return (
                f"{len(live)} rank(s) restarted in process, {len(dead)} started again "
                f"(attempt {self.attempt})"
            )

    async def _fail_in_process(self, why: str) -> NoReturn:
        await self._terminate(graceful=False, why="in-process restart failed")
        # "restarting": between attempts, until the controller's cold restart
        await self._report(f"in-process restart failed: {why}")
        raise RuntimeError(f"in-process restart failed: {why}")

    @abstractmethod
    def _survivors(self) -> tuple[list[RankT], list[RankT]]:
        """The current attempt's ranks split into (still running, exited)."""

    @abstractmethod
    def _rendezvous(self, live: list[RankT]) -> tuple[str, int]:
        """(address, port) of the next attempt's rendezvous: rank 0's, a port its previous
        group's store does not hold."""

    @abstractmethod
    async def _start_again(
        self, dead: list[RankT], master_addr: str, master_port: int, standbys: bool
    ) -> None:
        """Start the ``dead`` ranks again as ranks of the current attempt, into the
        rendezvous at ``master_addr:master_port``."""

    async def hot_swap(self, failed: str, spare: str, reason: str, standbys: bool = False) -> str:
        async with self._lock:
            membership = self._require_job()
            self.membership, chosen = membership.hot_swap(failed, spare)
            await self._relaunch(
                graceful=False,
                why="hot_swap",
                detail=f"{failed} replaced by {chosen}: {reason}",
                standbys=standbys,
            )
            return f"{failed} replaced by spare {chosen}; world size {self.membership.world_size}"

    async def scale_to(
        self, nodes: list[str], drop: list[str], reason: str, standbys: bool = False
    ) -> str:
        if standbys and self.membership is not None:
            # the nodes joining (a repaired one) have no standby yet: warm theirs while the
            # job still trains at its smaller size, rather than stop it for a cold start
            await self._warm_standbys([n for n in nodes if n not in self.membership.active])
        async with self._lock:
            membership = self._require_job()
            target = membership.scale_to(nodes, drop)
            growing = target.world_size > membership.world_size
            self.membership = target
            # growing: the running ranks are healthy, let them save first so no step is lost
            await self._relaunch(
                graceful=growing,
                why="scale_up" if growing else "scale_down",
                detail=f"{membership.world_size} → {target.world_size} ranks: {reason}",
                standbys=standbys,
            )
            return f"running on {', '.join(target.active)} ({target.world_size} ranks)"

    async def return_node(self, node: str) -> str:
        async with self._lock:
            self.membership = self._require_job().return_node(node)
            await self._report("node returned to the spare pool: " + node)
            return f"{node} is a spare again"

    async def stop(self, reason: str) -> str:
        async with self._lock:
            await self._release_standbys(None)
            if not self.ranks:
                return "no rank running"
            await self._terminate(graceful=True, why="stop")
            self.state = "stopped"
            await self._report(reason or "stopped on request")
            return "ranks saved and stopped"

    async def shutdown(self) -> None:
        """The actuator is going away: stop the ranks it owns (they save and exit)."""
        async with self._lock:
            await self._release_standbys(None)
            if self.ranks:
                await self._terminate(graceful=True, why="actuator shutdown")
                self.state = "stopped"

    def _require_job(self) -> Membership:
        if self.membership is None or self.spec is None:
            raise RuntimeError("no job has been started")
        return self.membership

    async def _report(self, detail: str) -> None:
        await self.emit(self.status(detail))

    async def _launched(self, state: schemas.JobStateName, finished_detail: str) -> bool:
        """Every rank of the attempt is started: the job is ``state`` ("starting" reads as
        running) — unless every rank already exited 0 while the others were started, which
        the exits left for the launch to say (a "running" would follow a "finished"). True
        when the attempt runs (its status is then the caller's to report)."""
        if self._finished():
            self.state = "finished"
            await self._report(finished_detail)
            return False
        self.state = state if state != "starting" else "running"
        return True

    def _finished(self) -> bool:
        """Every rank of the current attempt was seen exiting 0 (a backend that decides a
        launch's end from its ranks' exits overrides it)."""
        return False

    async def _prepare_volumes(self) -> None:
        """Before a relaunch: a swapped-in or returning node has an empty or stale volume."""
        if self.attempt <= 1 or self.ports.prepare_node is None or self.membership is None:
            return
        membership = self.membership
        nodes = membership.active
        outcomes = await asyncio.gather(
            *(
                self.ports.prepare_node(
                    node, membership.node_index(node), len(nodes), self.rollback_bound()
                )
                for node in nodes
            ),
            return_exceptions=True,
        )
        for node, outcome in zip(nodes, outcomes, strict=True):
            log.info("volume of %s prepared: %s", node, outcome)

    async def _reset_stopped_gpus(self, reset: dict[str, list[int]]) -> None:
        """Each node's host monitor resets its GPUs, now that no rank uses them.

        A reset that fails leaves the ranks stopped and fails the command, so the controller
        decides the fault again (the next rung replaces the node).
        """
        holders = await self._gpu_holders(list(reset))
        if holders:
            why = "; ".join(f"{node} still has {what}" for node, what in holders.items())
            await self._report(f"GPU reset not asked, ranks stay stopped: {why}")
            raise RuntimeError(f"GPU reset not asked, ranks not relaunched: {why}")
        await self._report(f"ranks stopped; resetting the GPUs of {', '.join(reset)}")
        if self.ports.reset_gpus is None:
            raise RuntimeError("GPU reset asked for, but this actuator reaches no host monitor")
        outcomes = await asyncio.gather(
            *(
                self.ports.reset_gpus(node, gpus, self.run_id, self.attempt)
                for node, gpus in reset.items()
            )
        )
        failed = [
            f"{node}: {detail}"
            for node, (ok, detail) in zip(reset, outcomes, strict=True)
            if not ok
        ]
        if failed:
            why = "; ".join(failed)
            await self._report(f"GPU reset failed, ranks stay stopped: {why}")
            raise RuntimeError(f"GPU reset failed, ranks not relaunched: {why}")

    async def _relaunch(
        self,
        *,
        graceful: bool,
        why: str,
        detail: str,
        reset_gpus: dict[str, list[int]] | None = None,
        standbys: bool = False,
    ) -> None:
        self.state = "restarting"
        with _tracer.start_as_current_span(
            "actuator stop ranks", attributes={"goodput.why": why, "goodput.graceful": graceful}
        ):
            await self._terminate(graceful=graceful, why=why)
        if reset_gpus:
            # a standby may hold the GPU (its model built there): a reset needs it idle
            await self._release_standbys(list(reset_gpus))
            with _tracer.start_as_current_span(
                "actuator reset gpus", attributes={"goodput.nodes": sorted(reset_gpus)}
            ):
                await self._reset_stopped_gpus(reset_gpus)
        # the ranks are told this span's context: their restore and first step hang under it
        with _tracer.start_as_current_span(
            "actuator launch ranks",
            attributes={"goodput.attempt": self.attempt + 1, "goodput.why": why},
        ):
            await self._launch("running", detail, standbys=standbys)


def not_rejoined(
    live: list[int], answers: dict[int, schemas.RankRejoined], deadline_s: float
) -> str:
    """Why the ``live`` ranks did not all rejoin ("" when they did)."""
    problems = []
    for rank in live:
        answer = answers.get(rank)
        if answer is None:
            problems.append(f"rank {rank} did not rejoin within {deadline_s:g} s")
        elif not answer.ok:
            problems.append(f"rank {rank} cannot: {answer.detail}")
    return "; ".join(problems)
