"""The node agent: one per host, the actuator's hands there.

It holds its node name in ``gp_agents`` (refused when a live agent holds it), refreshes its
record every second and on every change of its ranks (with a few ports free on this host: a
rendezvous binds one), executes ``LaunchRanks``/``SignalRanks``/``KeepStandbys`` once each
(``bus.commands.CommandRunner`` on ``agent-<node>``), makes up its standby ranks once the job
steps after one was taken or died (as the local backend does: started while the ranks start
up, they would slow them down), runs the node's host monitor and replicator
(:mod:`.daemons`) unless they run elsewhere, and — unless a host monitor reports this
node — sends a host report (``HostHealth``: its ranks alive and expected) every two seconds,
so that the sensor tells a lost node (its ranks and its reports silent) from a dead rank, and
a node whose agent returns reports healthy again (``node_returned``). The bus going away
changes nothing for the ranks: they run on, and the record, the exits seen meanwhile and the
reports reach the bus when it is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Mapping
from pathlib import Path

from goodput import schemas, subjects
from goodput.bus import Bus, BusSettings, CommandRunner
from goodput.bus.commands import until_stored
from goodput.bus.job_events import next_step
from goodput.bus.routing import decode_event_on
from goodput.supervisor.agent import registry
from goodput.supervisor.agent.daemons import NodeDaemons
from goodput.supervisor.agent.host import free_port
from goodput.supervisor.agent.ranks import HostRanks
from goodput.supervisor.rank_processes import STOP_GRACE_S

log = logging.getLogger(__name__)

#: how often the record is refreshed (it lapses after subjects.AGENT_TTL_S)
REFRESH_S = 1.0
#: how often the host report is sent (a host monitor's default period)
HOST_REPORT_S = 2.0
#: free ports announced: a launch and an in-process restart within one refresh take two
FREE_PORTS = 4
#: how long the node daemons may take to stop (a service's own stop deadline is 20 s)
DAEMON_STOP_S = 25.0


class AgentLoopDied(RuntimeError):
    """One of the agent's loops raised: its ranks were stopped, and it exits non-zero."""


class NodeAgent:
    def __init__(
        self,
        *,
        job: str,
        node: str,
        address: str,
        gpus: list[int],
        bus_settings: BusSettings,
        state_dir: Path,
        host_report: bool = True,
        daemons: NodeDaemons | None = None,
        host_env: Mapping[str, str] | None = None,
    ):
        self.job, self.node, self.address, self.gpus = job, node, address, gpus
        self.bus_settings = bus_settings
        self.host_report = host_report
        #: the host monitor and replicator it runs (None: they run elsewhere, or not at all)
        self.daemons = daemons
        self.state_dir = state_dir
        self.instance = schemas.new_id()[:12]
        self.started_ts = schemas.now_ns()
        self.bus: Bus | None = None
        self._changed = asyncio.Event()
        self.ranks = HostRanks(
            job=job,
            node=node,
            state_dir=state_dir,
            emit=self._emit,
            changed=self._changed.set,
            host_env=host_env,
        )

    def record(self) -> schemas.AgentRecord:
        return schemas.AgentRecord(
            job=self.job,
            node=self.node,
            address=self.address,
            pid=os.getpid(),
            instance=self.instance,
            started_ts=self.started_ts,
            state_dir=str(self.state_dir),
            gpus=self.gpus,
            free_ports=[free_port() for _ in range(FREE_PORTS)],
            run_id=self.ranks.run_id,
            ranks=self.ranks.records(),
            standbys=self.ranks.standbys.ready_pids().get(self.node, []),
        )

    async def run(self, stopping: asyncio.Event) -> None:
        """Hold the node until ``stopping`` is set; raises :class:`registry.NodeHeld`."""
        self.bus = bus = await Bus.connect(self.bus_settings, name=f"goodput-agent-{self.node}")
        try:
            await bus.provision()
            await registry.claim(bus, self.record())
            await self._serve(bus, stopping)
        finally:
            await bus.close()

    async def _serve(self, bus: Bus, stopping: asyncio.Event) -> None:
        runner = CommandRunner(
            bus,
            job=self.job,
            target=subjects.node_target(subjects.AGENT, self.node),
            service="agent",
            execute=self.execute,
            fence=lambda command: self.ranks.fence(),
        )
        rejoins = await bus.nc.subscribe(
            subjects.event(self.job, schemas.kind_of(schemas.RankRejoined)), cb=self._rejoined
        )
        keeper = asyncio.create_task(self._keep_standbys(bus))
        tasks = [asyncio.create_task(runner.run()), asyncio.create_task(self._refresh(bus)), keeper]
        if self.host_report:
            tasks.append(asyncio.create_task(self._report_host(bus)))
        if self.daemons is not None:  # once the name is held: a second agent starts none
            tasks.append(asyncio.create_task(self.daemons.run()))
        log.info("agent of %s serving job %s at %s", self.node, self.job, self.address)
        stop = asyncio.create_task(stopping.wait())
        await asyncio.wait([stop, *tasks], return_when=asyncio.FIRST_COMPLETED)
        died = [
            task
            for task in tasks
            if task.done() and not task.cancelled() and task.exception() is not None
        ]
        for task in died:
            log.error("agent loop died", exc_info=task.exception())
        runner.stop()
        await _cancelled([keeper])  # no standby is started while they are being stopped
        await self.ranks.stop(STOP_GRACE_S)
        await _cancelled([stop, *tasks])
        if self.daemons is not None:  # after the ranks: their last checkpoint is indexed
            await self.daemons.stop(DAEMON_STOP_S)
        with contextlib.suppress(Exception):
            await rejoins.unsubscribe()
            await asyncio.wait_for(registry.release(bus, self.job, self.node), 5)
        if died:
            raise AgentLoopDied(str(died[0].exception())) from died[0].exception()

    async def execute(self, command: schemas.Command) -> tuple[bool, str]:
        match command:
            case (
                schemas.LaunchRanks(node=node)
                | schemas.SignalRanks(node=node)
                | schemas.KeepStandbys(node=node)
            ) if node != self.node:
                return False, f"agent of {self.node} got a command for {node}"
            case schemas.LaunchRanks() if command.ts < self.started_ts:
                # sent to an earlier agent of this node that died before taking it: the
                # actuator has given up on it (and on that node's ranks) since
                return False, f"launch sent before the agent of {self.node} started; not run"
            case schemas.LaunchRanks():
                try:
                    return True, await self.ranks.launch(command)
                except OSError as exc:  # a missing executable, a bad working directory
                    return False, f"cannot start the ranks on {self.node}: {exc}"
            case schemas.SignalRanks():
                return True, self.ranks.signal(command)
            case schemas.KeepStandbys():
                try:
                    return True, await self.ranks.keep_standbys(command)
                except OSError as exc:
                    return False, f"cannot start standbys on {self.node}: {exc}"
        return False, f"a node agent does not execute {schemas.kind_of(type(command))}"

    async def _rejoined(self, msg) -> None:
        try:
            event = decode_event_on(msg.subject, msg.data)
        except schemas.SchemaError:
            return  # the sensor's consumer dead-letters it
        if isinstance(event, schemas.RankRejoined) and event.node == self.node:
            self.ranks.rejoined(event)

    async def _emit(self, event: schemas.Event) -> None:
        """Report an event, through any bus outage (an exit is reported when it is back)."""
        assert self.bus is not None
        bus = self.bus
        await until_stored(lambda: bus.emit(event), f"reporting {schemas.kind_of(type(event))}")

    async def _keep_standbys(self, bus: Bus) -> None:
        """Start the standbys this host lacks once the job steps after one was taken or died."""
        wanted = self.ranks.standbys.wanted
        while True:
            await wanted.wait()
            try:
                await next_step(bus, self.job)
            except Exception as exc:  # the bus is away: wait again once it is back
                log.debug("no step awaited: %r", exc)
                await asyncio.sleep(REFRESH_S)
                continue
            if wanted.is_set():  # not filled at once by a KeepStandbys meanwhile
                try:
                    await self.ranks.fill_standbys()
                except OSError as exc:  # the job's argv or workdir is gone from this host
                    log.warning("standbys not started on %s: %s", self.node, exc)

    async def _refresh(self, bus: Bus) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), REFRESH_S)
            self._changed.clear()
            try:
                await registry.refresh(bus, self.record())
            except Exception as exc:  # the bus is away: the next refresh may get through
                log.debug("record not refreshed: %r", exc)

    async def _report_host(self, bus: Bus) -> None:
        while True:
            current = self.ranks.current()
            report = schemas.HostHealth(
                job=self.job,
                node=self.node,
                healthy=True,
                gpu_available=bool(self.gpus),
                ranks_alive=sum(1 for r in current if r.process.returncode is None),
                ranks_expected=len(current),
                attempt=max((r.attempt for r in current), default=0),
                detail=f"node agent pid {os.getpid()}",
            )
            try:
                await bus.emit(report, retry_for_s=HOST_REPORT_S)
            except Exception as exc:  # a report lost to an outage is superseded by the next
                log.debug("host report lost: %r", exc)
            await asyncio.sleep(HOST_REPORT_S)


async def _cancelled(tasks: list[asyncio.Task]) -> None:
    """Cancel ``tasks`` and wait until each has ended, cancelling again any that runs on: a
    cancellation that meets a bus call in flight can be swallowed (the loop then goes on)."""
    pending = set(tasks)
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=1.0)
