"""The agent backend's standby ranks: each node agent keeps a pool of its host's own
(``goodput.supervisor.standby_pool``, as the local backend keeps one for its nodes); the actuator only
tells the agents what to keep and reads what they report ready.

Every node of the job (spares included: ``standby_nodes = "all"``) is told the run's
``KeepStandbys`` once per agent instance — an agent that started again since is told again —
and a node that left the job is told to keep none. A launch that asks for standbys marks its
``RankLaunch``es ``standby``: the agent hands the rank to a ready standby of its host, or
starts it cold. The ready pids come back in the agents' records (``AgentRecord.standbys``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from goodput import schemas
from goodput_services.actuator.agent_directory import AgentDirectory

log = logging.getLogger(__name__)

#: the commands a node's agent executes (each names its ``node``)
AgentCommand = schemas.LaunchRanks | schemas.SignalRanks | schemas.KeepStandbys
#: sends a command to its node's agent and returns (ok, detail) once the agent answered
SendCommand = Callable[[AgentCommand], Awaitable[tuple[bool, str]]]

#: how long a scale-up waits for a standby on each joining node (the job trains meanwhile)
STANDBY_WARM_S = 60.0


class AgentStandbys:
    """What the agents of one run were told to keep, and what they report ready."""

    def __init__(self, job: str, agents: AgentDirectory, send: SendCommand) -> None:
        self.job, self.agents, self.send = job, agents, send
        self.run_id = ""
        self.count = 0
        self.argv: list[str] = []
        self.workdir = ""
        self.env: dict[str, str] = {}
        #: node -> the agent instance told to keep the run's standbys
        self.told: dict[str, str] = {}
        #: node -> the ready pids its agent last reported (a change is a new JobStatus)
        self.reported: dict[str, list[int]] = {}

    def begin_run(
        self, run_id: str, count: int, argv: list[str], workdir: str, env: dict[str, str]
    ) -> None:
        """A new run: its agents switch to it on its first command (the old run's standbys
        were stopped with it)."""
        self.run_id, self.count, self.argv, self.workdir = run_id, count, argv, workdir
        self.env = env
        self.told, self.reported = {}, {}

    def ready(self, nodes: list[str]) -> dict[str, list[int]]:
        """The ready standbys of ``nodes`` whose agents are live and in this run."""
        if not self.count:
            return {}
        now = time.monotonic()
        ready = {}
        for node in nodes:
            record = self.agents.records.get(node)
            if record is None or not self.agents.is_live(node, now):
                continue
            if record.run_id == self.run_id and record.standbys:
                ready[node] = list(record.standbys)
        return ready

    def changed(self, record: schemas.AgentRecord) -> bool:
        """Whether ``record`` reports other ready standbys than its agent did before."""
        if not self.count or record.run_id != self.run_id:
            return False
        before = self.reported.get(record.node, [])
        self.reported[record.node] = list(record.standbys)
        return before != record.standbys

    async def sync(self, nodes: list[str]) -> None:
        """``nodes`` (the job's, spares included) keep the run's standbys; a node that left
        the job keeps none."""
        if not self.count:
            return
        now = time.monotonic()
        keep = [
            node
            for node in nodes
            if self.agents.is_live(node, now)
            and self.told.get(node) != self.agents.records[node].instance
        ]
        leaving = [node for node in self.told if node not in nodes]
        for node in leaving:
            del self.told[node]
        await self._tell(keep, self.count)
        await self._tell([n for n in leaving if self.agents.is_live(n, now)], 0)

    async def release(self, nodes: list[str] | None) -> None:
        """Stop the standbys of ``nodes`` (made up after the job's next step: a GPU reset
        needs the GPU idle) or, with None, every one for good (the run stops or ended)."""
        if not self.count:
            return
        now = time.monotonic()
        if nodes is None:
            told, self.told = list(self.told), {}
            await self._tell([n for n in told if self.agents.is_live(n, now)], 0)
        else:
            await self._tell([n for n in nodes if self.agents.is_live(n, now)], self.count, True)

    async def warm(self, nodes: list[str]) -> None:
        """Have ``nodes`` start their standbys now and wait, at most STANDBY_WARM_S, until
        each reports one ready (the ranks of those still without start cold)."""
        if not self.count or not nodes:
            return
        now = time.monotonic()
        await self._tell(
            [n for n in nodes if self.agents.is_live(n, now)], self.count, at_once=True
        )
        deadline = time.monotonic() + STANDBY_WARM_S
        while (cold := [n for n in nodes if n not in self.ready(nodes)]) and (
            time.monotonic() < deadline
        ):
            await asyncio.sleep(0.2)
        if cold:
            log.warning(
                "no ready standby on %s within %.0f s: their ranks start cold",
                ", ".join(cold),
                STANDBY_WARM_S,
            )

    async def _tell(
        self, nodes: list[str], count: int, release: bool = False, at_once: bool = False
    ) -> None:
        """Send each node's agent its ``KeepStandbys``; a refusal is logged (the launches
        that would take them start their ranks cold)."""
        commands = [
            schemas.KeepStandbys(
                job=self.job,
                node=node,
                run_id=self.run_id,
                count=count,
                argv=list(self.argv),
                workdir=self.workdir,
                env=dict(self.env),
                release=release,
                at_once=at_once,
            )
            for node in nodes
        ]
        outcomes = await asyncio.gather(*(self.send(c) for c in commands))
        for node, (ok, detail) in zip(nodes, outcomes, strict=True):
            if not ok:
                log.warning("standbys on %s: %s", node, detail)
            elif count and (record := self.agents.records.get(node)) is not None:
                self.told[node] = record.instance
