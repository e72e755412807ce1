"""The rank processes of one host, as its agent starts, signals and reports them.

A rank is a :class:`~goodput.supervisor.rank_processes.RankProcess`, started, watched and
stopped as the local backend's are (:mod:`goodput.supervisor.rank_processes`: its own
session, output to ``logs/ranks/attempt-NNN/<node>-rank<R>.log`` under the agent's state
directory), with the environment the actuator wrote for it over this host's own (and, under
both, the collectives' interface the agent found: ``host_env``); a command starting with
``python``/``python3`` runs in the agent's own interpreter, as ``goodput run`` does locally.
It is the agent's child and dies with it (``PR_SET_PDEATHSIG``): an agent gone is its node
gone, and a rank left behind would keep a host the supervisor replaced in the job's
collectives.
Every start and exit is reported as the same ``RankStarted``/``RankExited`` events the local
backend emits (a rank restarted in process exits as a rank of the attempt it rejoined: the
agent follows the ranks' ``RankRejoined``), through the bus's retrying publish: an exit seen while the bus is away is
reported when it is back.

Its standby ranks (``KeepStandbys``) are the local backend's: a ``goodput.supervisor.standby_pool`` of
this host's own, whose processes die with the agent too. A rank launched with
``RankLaunch.standby`` is a ready standby handed the rank's ``RankEnv`` (cold when none is
ready), watched and reported from then on like a rank started cold.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

from goodput import schemas
from goodput.launch.rank_env import RankEnv, RankEnvError
from goodput.launch.rank_logs import rank_log
from goodput.state_dir import StateDir
from goodput.supervisor.rank_processes import (
    RankProcess,
    die_with_parent,
    signal_group,
    spawn_rank,
    stop_ranks,
    watch,
)
from goodput.supervisor.standby_pool import StandbyPool

log = logging.getLogger(__name__)

EventSink = Callable[[schemas.Event], Awaitable[None]]
Changed = Callable[[], None]

#: the agent's ranks and standbys are killed when it dies
_DIE_WITH_AGENT = die_with_parent(signal.SIGKILL)
#: how long the agent waits for killed ranks' exits to be reported
_KILL_SETTLE_S = 10.0


class HostRanks:
    """This host's ranks of the job's current run."""

    def __init__(
        self,
        *,
        job: str,
        node: str,
        state_dir: Path,
        emit: EventSink,
        changed: Changed,
        host_env: Mapping[str, str] | None = None,
    ):
        self.job, self.node, self.state_dir = job, node, state_dir
        self.emit, self.changed = emit, changed
        #: what this host adds under each rank's and standby's own environment (the
        #: collectives' interface: ``goodput.launch.collective_sockets``)
        self.host_env = dict(host_env or {})
        self.run_id = ""
        self.ranks: list[RankProcess] = []
        self.standbys = StandbyPool(
            StateDir(state_dir).standby_logs, self._standbys_changed, _DIE_WITH_AGENT
        )
        #: what the standbys were last asked for (a repeat leaves the pool as it is)
        self._standby_config: tuple = ()

    # ---- what the agent reports ----------------------------------------------------------------

    def records(self) -> list[schemas.AgentRank]:
        return [r.record() for r in sorted(self.ranks, key=lambda r: (r.attempt, r.rank))]

    def current(self) -> list[RankProcess]:
        """The newest attempt's ranks (a host report counts them)."""
        newest = max((r.attempt for r in self.ranks), default=0)
        return [r for r in self.ranks if r.attempt == newest]

    def fence(self) -> str:
        """What a launch or signal acts on: a command begun by an agent that died before it
        recorded the outcome runs again only if this is unchanged (``bus.commands``)."""
        running = sorted((r.attempt, r.rank) for r in self.ranks if r.process.returncode is None)
        return f"run {self.run_id or '-'} running {running}"

    # ---- commands ------------------------------------------------------------------------------

    async def launch(self, command: schemas.LaunchRanks) -> str:
        await self._enter_run(command.run_id)
        started, warm = [], []
        for spec in command.ranks:
            if any(r.rank == spec.rank and r.attempt == command.attempt for r in self.ranks):
                continue  # a redelivered launch: that rank of that attempt runs already
            # an older attempt's process of the same rank is done with (exited or being killed)
            self.ranks = [
                r for r in self.ranks if r.rank != spec.rank or r.process.returncode is None
            ]
            process = await self._from_standby(spec) if spec.standby else None
            if process is not None:
                warm.append(spec.rank)
            else:
                process = await self._spawn(command, spec)
            await self._started(command.attempt, spec, process)
            started.append(spec.rank)
        self.changed()
        done = f"started rank(s) {started} of attempt {command.attempt} on {self.node}"
        return done + (f" ({warm} from standbys)" if warm else "")

    async def keep_standbys(self, command: schemas.KeepStandbys) -> str:
        await self._enter_run(command.run_id)
        argv = _interpreter(command.argv)
        config = (command.count, argv, command.workdir, command.env)
        if config != self._standby_config:  # a repeat keeps the pool (and what it disabled)
            self._standby_config = config
            env = {**self.host_env, **command.env}
            self.standbys.configure(command.count, argv, command.workdir or None, env)
        if not command.count:
            await self.standbys.stop()
            return f"no standbys kept on {self.node}"
        if command.release:
            await self.standbys.stop()
        if command.at_once:
            await self.fill_standbys()
        return f"{command.count} standby(s) kept on {self.node}"

    async def fill_standbys(self) -> int:
        """Start the standbys this host lacks (after the job's next step, or at once)."""
        self.standbys.wanted.clear()
        return await self.standbys.fill([self.node])

    def rejoined(self, event: schemas.RankRejoined) -> None:
        """A rank restarted in process is a rank of the new attempt: its exit says so."""
        for entry in self.ranks:
            if entry.process.pid == event.pid and entry.rank == event.rank and event.ok:
                entry.attempt = max(entry.attempt, event.attempt)
                self.changed()

    def signal(self, command: schemas.SignalRanks) -> str:
        sig = signal.SIGTERM if command.signal == "term" else signal.SIGKILL
        hit = []
        for entry in self.ranks:
            if entry.process.returncode is not None or entry.attempt > command.attempt:
                continue
            if command.ranks and entry.rank not in command.ranks:
                continue
            entry.expected_reason = command.expected_reason
            signal_group(entry.process.pid, sig)
            hit.append(entry.rank)
        return f"{command.signal} sent to rank(s) {sorted(hit)} on {self.node}"

    async def stop(self, grace_s: float) -> None:
        """The agent is stopping (SIGTERM): its ranks save and exit, killed after ``grace_s``;
        its standbys are stopped at once."""
        self.standbys.configure(0, [], None, {})
        await self.standbys.stop()
        await stop_ranks(self.ranks, "agent stopped", grace_s, _KILL_SETTLE_S)

    # ---- machinery -----------------------------------------------------------------------------

    async def _enter_run(self, run_id: str) -> None:
        """A command of a new run: the earlier run's ranks are not this run's (the actuator
        stopped them), nor are its standbys (built with its environment)."""
        if run_id == self.run_id:
            return
        await self._kill_all("new run")
        self.standbys.configure(0, [], None, {})
        self._standby_config = ()
        await self.standbys.stop()
        self.ranks, self.run_id = [], run_id

    async def _standbys_changed(self, what: str) -> None:
        self.changed()

    async def _from_standby(self, spec: schemas.RankLaunch) -> asyncio.subprocess.Process | None:
        """A ready standby of this host, now rank ``spec`` (None: the rank starts cold)."""
        if not self.standbys.per_node:
            log.warning("no standbys are kept on %s: rank %d starts cold", self.node, spec.rank)
            return None
        try:
            env = RankEnv.from_env(spec.env)
        except RankEnvError as exc:
            log.warning("rank %d starts cold: its environment is no RankEnv (%s)", spec.rank, exc)
            return None
        standby = self.standbys.take(self.node)  # logs why when there is none
        if standby is None or not await self.standbys.assign(standby, env):
            return None
        log.info("rank %d on %s: standby %d", spec.rank, self.node, standby.process.pid)
        return standby.process

    async def _kill_all(self, why: str) -> None:
        await stop_ranks(self.ranks, why, 0, _KILL_SETTLE_S)

    async def _spawn(
        self, command: schemas.LaunchRanks, spec: schemas.RankLaunch
    ) -> asyncio.subprocess.Process:
        return await spawn_rank(
            _interpreter(command.argv),
            env={**self.host_env, **spec.env},
            cwd=command.workdir or None,
            output=rank_log(self.state_dir, command.attempt, self.node, spec.rank),
            preexec_fn=_DIE_WITH_AGENT,
        )

    async def _started(
        self, attempt: int, spec: schemas.RankLaunch, process: asyncio.subprocess.Process
    ) -> None:
        """``process`` is rank ``spec`` of ``attempt`` from now on: watch it, and say so."""
        entry = RankProcess(
            node=self.node,
            rank=spec.rank,
            local_rank=spec.local_rank,
            attempt=attempt,
            process=process,
        )
        self.ranks.append(entry)
        watch(entry, self.job, self.emit, self._exit_seen)
        world_size = int(spec.env.get("WORLD_SIZE", "1") or 1)
        await self.emit(
            schemas.RankStarted(
                job=self.job,
                node=self.node,
                rank=spec.rank,
                local_rank=spec.local_rank,
                world_size=world_size,
                pid=process.pid,
                attempt=attempt,
            )
        )
        log.info("rank %d of attempt %d started: pid %d", spec.rank, attempt, process.pid)

    def _exit_seen(self, entry: RankProcess) -> None:
        self.changed()


def _interpreter(argv: list[str]) -> list[str]:
    """A command starting with ``python``/``python3`` runs in the agent's interpreter (it has
    goodput, and torch)."""
    if argv and argv[0] in ("python", "python3"):
        return [sys.executable, *argv[1:]]
    return list(argv)
