"""The agent backend: a "node" is a host running ``goodput agent``; its ranks are its agent's.

The actuator holds no rank process. It reads the live agents from ``gp_agents``
(``agent_directory``), takes the job's nodes from them (sorted by name: the first ``nodes``
active, the next ``spares`` spare), and drives each through commands on
``gp.<job>.cmd.agent-<node>`` (executed once by id by the agent's ``CommandRunner``):
``LaunchRanks`` carries every rank's whole environment, written by the same
``MembershipBackend.rank_environment`` the local backend uses, with the rendezvous at the
address rank 0's agent announced (never loopback) on a port its host had free;
``SignalRanks`` stops them. The agents report starts and exits as the same events the local
backend emits; the backend follows its ranks through the agents' records.

The ladder is the local backend's: cold launch, kill, in-process restart (the survivors rejoin
at rank 0's agent, the dead ranks are launched again by their agents), GPU reset (through the
node's host monitor, as on every backend), hot swap and scale. A node whose agent is gone
(its record lapsed) cannot be launched on: a launch there fails at once, and the sensor has
seen the node lost (its ranks died with the agent, its host reports stopped). A node that was
only cut off comes back with its ranks of the attempt given up still running: they are killed
as soon as its agent's record shows them (:func:`stray_ranks`). Standby ranks
are the local backend's too, each agent keeping its host's (``agent_standbys``): on every node
of the job, spares included (``standbys="all"`` in its capabilities).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from goodput import schemas, subjects
from goodput.bus import Bus, BusSettings
from goodput.bus.commands import request
from goodput.checkpoint.format import node_volume
from goodput.launch import capacity
from goodput.supervisor.membership import Membership, check_job_shape
from goodput.supervisor.rank_processes import STOP_GRACE_S
from goodput.telemetry import untraced_task
from goodput_services.actuator.agent_directory import AgentDirectory
from goodput_services.actuator.agent_standbys import AgentCommand, AgentStandbys
from goodput_services.actuator.backend import MembershipBackend
from goodput_services.actuator.ports import BusPorts

log = logging.getLogger(__name__)

#: how long a start waits for the agents it needs to be live
AGENTS_WAIT_S = 30.0
#: how long an agent may take to answer a command (it only forks or signals)
COMMAND_TIMEOUT_S = 30.0
#: after SIGKILL, how long the agents may take to report the exits
KILL_WAIT_S = 10.0
#: after a launch, how long the agents may take to report the new ranks' pids
PIDS_WAIT_S = 5.0
#: why a rank of an attempt given up (its node was cut off, and is back) is killed
STRAY_REASON = "a rank of an attempt given up while its node was lost"


@dataclass
class AgentRankEntry:
    """A rank of the current run, as its agent last reported it."""

    node: str
    rank: int
    local_rank: int
    attempt: int
    pid: int = 0
    exit_code: int | None = None
    #: its agent reported its pid
    started: asyncio.Event = field(default_factory=asyncio.Event)
    exited: asyncio.Event = field(default_factory=asyncio.Event)


class AgentBackend(MembershipBackend[AgentRankEntry]):
    name = "agent"
    stop_grace_s = STOP_GRACE_S
    #: standbys on every node of the job, spares included, each kept by its agent
    standby_nodes = "all"

    def __init__(
        self,
        *,
        job: str,
        bus_settings: BusSettings,
        ports: BusPorts,
    ):
        super().__init__(job=job, bus_settings=bus_settings, ports=ports)
        self.agents = AgentDirectory(job)
        self.standbys = AgentStandbys(job, self.agents, self._agent_command)
        self.bus: Bus | None = None
        self._follower: asyncio.Task[None] | None = None
        #: ranks being stopped: out of ``ranks``, but their exits still come from the records
        self._stopping: list[AgentRankEntry] = []
        #: rendezvous ports the run's attempts used (a new group's store needs a fresh one)
        self._used_ports: set[tuple[str, int]] = set()
        #: (node, pid) of the strays already told to die (a record repeats every second)
        self._strays_killed: set[tuple[str, int]] = set()

    async def connect_bus(self, bus: Bus) -> None:
        self.bus = bus
        self._follower = untraced_task(self.agents.follow(bus, self._on_record))

    # ---- commands ----------------------------------------------------------------------------

    async def start_job(self, spec: schemas.StartJob) -> str:
        async with self._lock:
            check_job_shape(spec)
            if spec.image or spec.gpus_per_rank is not None:
                raise RuntimeError(
                    "the agent backend runs ranks as processes of the hosts' agents: a job "
                    "naming an image or GPUs per rank needs --set backend=kubernetes"
                )
            wanted = spec.nodes + spec.spares
            live = await self._wait_for_agents(wanted)
            if len(live) < wanted:
                raise RuntimeError(
                    f"the job needs {spec.nodes} node(s) + {spec.spares} spare(s) but "
                    f"{len(live)} agent(s) of job {self.job} are live"
                    + (f" ({', '.join(live)})" if live else "")
                    + ": start `goodput agent` on each host"
                )
            chosen = live[:wanted]
            records = self.agents.live(time.monotonic())
            gpus = {node: len(records[node].gpus) for node in chosen if node in records}
            short = capacity.gpu_problems(spec.procs_per_node, gpus)
            if short:
                raise RuntimeError("; ".join(short))
            await self._begin_run(spec)
            await self._terminate(graceful=False, why="new run")
            self._used_ports.clear()
            self.standbys.begin_run(
                spec.run_id,
                spec.standbys,
                list(spec.argv),
                spec.workdir,
                self.standby_environment(),
            )
            self.membership = Membership(
                active=chosen[: spec.nodes],
                spares=chosen[spec.nodes :],
                procs_per_node=spec.procs_per_node,
            )
            await self._launch("starting", "job started")
            return (
                f"started {self.membership.world_size} ranks on {', '.join(self.membership.active)}"
            )

    async def _wait_for_agents(self, wanted: int) -> list[str]:
        """The live agents' nodes, sorted, once ``wanted`` are live or after AGENTS_WAIT_S
        (agents started with the job, as in a Slurm batch script, announce in seconds)."""
        deadline = time.monotonic() + AGENTS_WAIT_S
        while True:
            live = sorted(self.agents.live(time.monotonic()))
            if len(live) >= wanted or time.monotonic() >= deadline:
                return live
            await asyncio.sleep(0.2)

    async def shutdown(self) -> None:
        await super().shutdown()
        if self._follower is not None:
            self._follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._follower
            self._follower = None

    # ---- in-process restart (the sequence is MembershipBackend.restart_in_process) ----------

    def _survivors(self) -> tuple[list[AgentRankEntry], list[AgentRankEntry]]:
        """A rank whose agent is gone is dead too (it died with its agent): starting it
        again there fails at once, instead of a Rejoin waiting out its deadline for it."""
        now = time.monotonic()
        live = [r for r in self.ranks if not r.exited.is_set() and self.agents.is_live(r.node, now)]
        return live, [r for r in self.ranks if r not in live]

    def _rendezvous(self, live: list[AgentRankEntry]) -> tuple[str, int]:
        assert self.membership is not None
        return self._rendezvous_on(self.membership.active[0])

    async def _start_again(
        self, dead: list[AgentRankEntry], master_addr: str, master_port: int, standbys: bool
    ) -> None:
        """Each dead rank launched again by its node's agent (from a ready standby of its host
        with ``standbys``)."""
        for entry in dead:
            self.ranks.remove(entry)
        await self._launch_ranks(
            [(e.node, e.rank, e.local_rank) for e in dead], master_addr, master_port, standbys
        )

    # ---- standbys (agent_standbys) -----------------------------------------------------------

    def _standby_pids(self) -> dict[str, list[int]]:
        if self.membership is None:
            return {}
        return self.standbys.ready([*self.membership.active, *self.membership.spares])

    async def _release_standbys(self, nodes: list[str] | None) -> None:
        await self.standbys.release(nodes)

    async def _warm_standbys(self, nodes: list[str]) -> None:
        await self.standbys.warm(nodes)

    async def return_node(self, node: str) -> str:
        done = await super().return_node(node)
        async with self._lock:  # a spare again: it keeps standbys for the next hot swap
            if self.membership is not None:
                await self.standbys.sync([*self.membership.active, *self.membership.spares])
        return done

    # ---- machinery ---------------------------------------------------------------------------

    def _pids(self) -> dict[str, list[int]]:
        pids: dict[str, list[int]] = {}
        for entry in sorted(self.ranks, key=lambda r: r.rank):
            if entry.pid and not entry.exited.is_set():
                pids.setdefault(entry.node, []).append(entry.pid)
        return pids

    def _rendezvous_on(self, node: str) -> tuple[str, int]:
        """The address node's agent announced, and a port free there no attempt of the run
        used yet."""
        record = self._live_record(node)
        for port in record.free_ports:
            if (node, port) not in self._used_ports:
                self._used_ports.add((node, port))
                return record.address, port
        raise RuntimeError(f"the agent of {node} announced no unused free port yet; try again")

    def _live_record(self, node: str) -> schemas.AgentRecord:
        if not self.agents.is_live(node, time.monotonic()):
            raise RuntimeError(
                f"no live agent on {node} (its record lapsed: the agent or its host is gone)"
            )
        return self.agents.records[node]

    async def _launch(
        self, state: schemas.JobStateName, detail: str, standbys: bool = False
    ) -> None:
        assert self.spec is not None and self.membership is not None
        self.attempt += 1
        membership = self.membership
        missing = [n for n in membership.active if not self.agents.is_live(n, time.monotonic())]
        if missing:
            await self._report(f"no live agent on {', '.join(missing)}: ranks not launched")
            raise RuntimeError(f"no live agent on {', '.join(missing)}: ranks not launched")
        await self._prepare_volumes()
        address, port = self._rendezvous_on(membership.active[0])
        await self._launch_ranks(
            [
                (node, node_index * membership.procs_per_node + local, local)
                for node_index, node in enumerate(membership.active)
                for local in range(membership.procs_per_node)
            ],
            address,
            port,
            standbys,
        )
        self.state = state if state != "starting" else "running"
        await self._report(detail)
        # the nodes of the job keep the run's standbys; a node that left it keeps none
        await self.standbys.sync([*membership.active, *membership.spares])

    async def _launch_ranks(
        self,
        ranks: list[tuple[str, int, int]],
        master_addr: str,
        master_port: int,
        standbys: bool = False,
    ) -> None:
        """Have the agents start ``ranks`` (node, rank, local rank) as ranks of the current
        attempt (from their hosts' ready standbys with ``standbys``); raises when an agent
        refuses or does not answer in time."""
        assert self.spec is not None and self.membership is not None
        # every node's agent first: no rank is recorded for a launch that cannot be sent
        records = {node: self._live_record(node) for node, _, _ in ranks}
        by_node: dict[str, list[schemas.RankLaunch]] = {}
        for node, rank, local_rank in ranks:
            record = records[node]
            env = self.rank_environment(
                node=node,
                node_index=self.membership.node_index(node),
                rank=rank,
                local_rank=local_rank,
                master_addr=master_addr,
                master_port=master_port,
                volume=node_volume(Path(record.state_dir), node, self.job),
            )
            by_node.setdefault(node, []).append(
                schemas.RankLaunch(rank=rank, local_rank=local_rank, env=env, standby=standbys)
            )
            self.ranks.append(
                AgentRankEntry(node=node, rank=rank, local_rank=local_rank, attempt=self.attempt)
            )
        entries = self.ranks[-len(ranks) :]
        commands = [
            schemas.LaunchRanks(
                job=self.job,
                node=node,
                run_id=self.run_id,
                attempt=self.attempt,
                argv=list(self.spec.argv),
                workdir=self.spec.workdir,
                ranks=launches,
            )
            for node, launches in by_node.items()
        ]
        await self._on_agents(commands, "launch")
        # the status that follows names their pids (chaos and the operators read them there)
        await _all_set([e.started for e in entries], PIDS_WAIT_S)

    async def _on_agents(self, commands: Sequence[AgentCommand], what: str) -> None:
        """Send each command to its node's agent and wait for every outcome."""
        outcomes = await asyncio.gather(*(self._agent_command(c) for c in commands))
        failed = [detail for ok, detail in outcomes if not ok]
        if failed:
            raise RuntimeError(f"{what} failed: " + "; ".join(failed))

    async def _agent_command(self, command: AgentCommand) -> tuple[bool, str]:
        assert self.bus is not None, "the agent backend has no bus yet"
        node = command.node
        target = subjects.command_target(command)

        def gone() -> bool:
            return not self.agents.is_live(node, time.monotonic())

        result = await request(
            self.bus, target, command, COMMAND_TIMEOUT_S, poll_s=0.05, abandon=gone
        )
        if result is not None:
            return result.ok, f"{node}: {result.detail}"
        if gone():
            return False, f"{node}: its agent is gone"
        return False, f"{node}: no answer from its agent within {COMMAND_TIMEOUT_S:.0f} s"

    async def _terminate(self, *, graceful: bool, why: str) -> None:
        ranks, self.ranks = self.ranks, []
        alive = [r for r in ranks if not r.exited.is_set()]
        if not alive:
            return
        reachable = sorted({r.node for r in alive if self.agents.is_live(r.node, time.monotonic())})
        lost = sorted({r.node for r in alive} - set(reachable))
        if lost:
            log.warning("ranks on %s not stopped: no live agent there", ", ".join(lost))
        waiting = self._stopping = [r for r in alive if r.node in reachable]
        try:
            await self._signal(reachable, "term" if graceful else "kill", why)
            if graceful and not await _exited(waiting, STOP_GRACE_S):
                log.warning("ranks ignored SIGTERM for %.0f s; killing them", STOP_GRACE_S)
                await self._signal(reachable, "kill", why)
            if not await _exited(waiting, KILL_WAIT_S):
                log.warning("agents did not report every stopped rank within %.0f s", KILL_WAIT_S)
        finally:
            self._stopping = []

    async def _signal(self, nodes: list[str], signal: schemas.RankSignal, why: str) -> None:
        commands = [
            schemas.SignalRanks(
                job=self.job,
                node=node,
                attempt=self.attempt,
                signal=signal,
                expected_reason=why,
            )
            for node in nodes
        ]
        try:
            await self._on_agents(commands, f"{signal} of the ranks")
        except RuntimeError as exc:
            log.warning("%s", exc)

    def _on_record(self, record: schemas.AgentRecord) -> None:
        """An agent's report: its ranks' pids and exits, its ready standbys (of this run
        only)."""
        if record.run_id != self.run_id or not self.run_id:
            return
        followed = [e for e in [*self.ranks, *self._stopping] if e.node == record.node]
        strays = [
            r
            for r in stray_ranks(record, followed, self.attempt)
            if (record.node, r.pid) not in self._strays_killed
        ]
        if strays:
            self._strays_killed.update((record.node, r.pid) for r in strays)
            untraced_task(self._kill_strays(record.node, strays))
        if self.standbys.changed(record) and self.state == "running":
            # the policy reads the ready standbys from the newest JobStatus
            untraced_task(self._report(f"standbys of {record.node}: {record.standbys}"))
        by_attempt = {(r.rank, r.attempt): r for r in record.ranks}
        by_pid = {(r.rank, r.pid): r for r in record.ranks}
        for entry in followed:
            # a rank restarted in process keeps its pid (its attempt moved on with the job's)
            rank = by_pid.get((entry.rank, entry.pid)) or (
                None if entry.pid else by_attempt.get((entry.rank, entry.attempt))
            )
            if rank is None:
                continue
            entry.pid = rank.pid
            entry.started.set()
            if not rank.running and not entry.exited.is_set():
                entry.exit_code = rank.exit_code
                entry.exited.set()
        finished = all(r.exited.is_set() and r.exit_code == 0 for r in self.ranks)
        if self.ranks and finished and self.state == "running":
            self.state = "finished"
            untraced_task(self._report("every rank exited 0"))
            untraced_task(self.standbys.release(None))  # the run is over: so are its standbys

    async def _kill_strays(self, node: str, strays: list[schemas.AgentRank]) -> None:
        """Kill ranks an agent runs that this run gave up: its node was lost while they ran
        (a partition) and is back; they would hold its GPUs and talk to the job's bus."""
        ranks = sorted(r.rank for r in strays)
        log.warning("ranks %s of %s belong to an attempt given up: killing them", ranks, node)
        command = schemas.SignalRanks(
            job=self.job,
            node=node,
            attempt=max(r.attempt for r in strays),
            signal="kill",
            ranks=ranks,
            expected_reason=STRAY_REASON,
        )
        ok, detail = await self._agent_command(command)
        if not ok:
            log.warning("strays on %s not killed: %s", node, detail)


def stray_ranks(
    record: schemas.AgentRecord, followed: list[AgentRankEntry], attempt: int
) -> list[schemas.AgentRank]:
    """The ranks ``record`` reports running that no rank the backend follows on its node
    (``followed``) is — matched by pid, or by rank and attempt while the pid is not known
    yet — of an attempt older than ``attempt``: given up when their node was lost (ranks
    there are not stopped), and running still because the node was only cut off."""
    pids = {e.pid for e in followed if e.pid}
    pending = {(e.rank, e.attempt) for e in followed if not e.pid}
    return [
        r
        for r in record.ranks
        if r.running
        and r.attempt < attempt
        and r.pid not in pids
        and (r.rank, r.attempt) not in pending
    ]


async def _exited(entries: list[AgentRankEntry], timeout_s: float) -> bool:
    return await _all_set([e.exited for e in entries], timeout_s)


async def _all_set(events: list[asyncio.Event], timeout_s: float) -> bool:
    """Whether every event is set within ``timeout_s``."""
    if events:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*(e.wait() for e in events)), timeout_s)
    return all(e.is_set() for e in events)
