"""The rank processes of one host, as its agent starts, signals and reports them.

A rank is started the way the local backend starts one (its own session, so its group can be
signalled; output to ``logs/ranks/attempt-NNN/<node>-rank<R>.log`` under the agent's state
directory), with the environment the actuator wrote for it over this host's own (and, under both, the
collectives' interface the agent found: ``host_env``); a command starting with
``python``/``python3`` runs in the agent's own interpreter, as ``goodput run`` does locally. It is the
agent's child and dies with it (``PR_SET_PDEATHSIG``): an agent gone is its node gone, and a
rank left behind would keep a host the supervisor replaced in the job's collectives.
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
import contextlib
import ctypes
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from goodput import schemas
from goodput.launch.rank_env import RankEnv, RankEnvError, with_rank_boot
from goodput.launch.rank_logs import rank_log_dir, rank_log_name
from goodput.state_dir import StateDir
from goodput.supervisor.standby_pool import StandbyPool

log = logging.getLogger(__name__)

EventSink = Callable[[schemas.Event], Awaitable[None]]
Changed = Callable[[], None]

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """The child gets SIGKILL when the agent dies (Linux; elsewhere a no-op)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


@dataclass
class RankProcess:
    rank: int
    local_rank: int
    attempt: int
    process: asyncio.subprocess.Process
    expected_reason: str = ""
    watcher: asyncio.Task[None] | None = field(default=None, repr=False)

    def record(self) -> schemas.AgentRank:
        code = self.process.returncode
        return schemas.AgentRank(
            rank=self.rank,
            local_rank=self.local_rank,
            attempt=self.attempt,
            pid=self.process.pid,
            exit_code=code if code is not None and code >= 0 else None,
            signal=-code if code is not None and code < 0 else None,
            running=code is None,
        )


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
            StateDir(state_dir).standby_logs, self._standbys_changed, _die_with_parent
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
            _signal_group(entry.process.pid, sig)
            hit.append(entry.rank)
        return f"{command.signal} sent to rank(s) {sorted(hit)} on {self.node}"

    async def stop(self, grace_s: float) -> None:
        """The agent is stopping (SIGTERM): its ranks save and exit, killed after ``grace_s``;
        its standbys are stopped at once."""
        self.standbys.configure(0, [], None, {})
        await self.standbys.stop()
        alive = [r for r in self.ranks if r.process.returncode is None]
        for entry in alive:
            entry.expected_reason = "agent stopped"
            _signal_group(entry.process.pid, signal.SIGTERM)
        waits = [asyncio.shield(r.process.wait()) for r in alive]
        if waits:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*waits), grace_s)
        await self._kill_all("agent stopped")

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
        for entry in self.ranks:
            if entry.process.returncode is None:
                entry.expected_reason = entry.expected_reason or why
                _signal_group(entry.process.pid, signal.SIGKILL)
        watchers = [r.watcher for r in self.ranks if r.watcher is not None]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*watchers, return_exceptions=True), 10)

    async def _spawn(
        self, command: schemas.LaunchRanks, spec: schemas.RankLaunch
    ) -> asyncio.subprocess.Process:
        logs = rank_log_dir(self.state_dir, command.attempt)
        logs.mkdir(parents=True, exist_ok=True)
        with open(logs / rank_log_name(self.node, spec.rank), "ab") as out:
            return await asyncio.create_subprocess_exec(
                *_interpreter(command.argv),
                cwd=command.workdir or None,
                env=with_rank_boot({**os.environ, **self.host_env, **spec.env}),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )

    async def _started(
        self, attempt: int, spec: schemas.RankLaunch, process: asyncio.subprocess.Process
    ) -> None:
        """``process`` is rank ``spec`` of ``attempt`` from now on: watch it, and say so."""
        entry = RankProcess(
            rank=spec.rank, local_rank=spec.local_rank, attempt=attempt, process=process
        )
        self.ranks.append(entry)
        entry.watcher = asyncio.create_task(self._watch(entry))
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

    async def _watch(self, entry: RankProcess) -> None:
        code = await entry.process.wait()
        log.info("rank %d (pid %d) exited %d", entry.rank, entry.process.pid, code)
        self.changed()
        await self.emit(
            schemas.RankExited.from_returncode(
                code,
                job=self.job,
                node=self.node,
                rank=entry.rank,
                pid=entry.process.pid,
                attempt=entry.attempt,
                expected_reason=entry.expected_reason,
            )
        )


def _interpreter(argv: list[str]) -> list[str]:
    """A command starting with ``python``/``python3`` runs in the agent's interpreter (it has
    goodput, and torch)."""
    if argv and argv[0] in ("python", "python3"):
        return [sys.executable, *argv[1:]]
    return list(argv)


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
