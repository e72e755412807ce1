"""Pre-warmed standby ranks as processes of this host: processes that have imported torch and
built the job's state (``goodput.shim.run_job``) and wait, on a channel of their own
(``goodput.launch.standby_channel``, the local flavour), to be told which rank they are.

Whoever starts a host's rank processes owns these too — the local backend's actuator for its
nodes, a node agent for its own host: it starts them (``StartJob.standbys`` per node, spares
included), learns when each is ready, hands one a rank's environment instead of starting a
process, and stops them with the run. A standby that dies is forgotten at once
(a launch never waits on it: that rank starts cold) and replaced by the next replenishment;
one that dies before it was ever ready means the job's script does not serve standbys, so its
node gets no more (each said in the log).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from goodput.launch.rank_env import VARIABLES, RankEnv, with_rank_boot
from goodput.launch.standby_channel import READY, encode_assignment
from goodput.supervisor.rank_processes import signal_group
from goodput.telemetry import untraced_task

log = logging.getLogger(__name__)

#: called after a standby became ready, died or was taken (the job status changed)
Changed = Callable[[str], Awaitable[None]]


@dataclass
class Standby:
    node: str
    process: asyncio.subprocess.Process
    writer: asyncio.StreamWriter
    ready: bool = False
    #: handed a rank (it is a rank process now) or stopped by the pool: not a death
    gone: bool = False
    watcher: asyncio.Task[None] | None = field(default=None, repr=False)


class StandbyPool:
    """Standby processes per node for one run of the job."""

    def __init__(
        self, logs: Path, changed: Changed, preexec_fn: Callable[[], None] | None = None
    ) -> None:
        self.logs = logs
        self.changed = changed
        #: run in each standby between fork and exec (an agent's standbys die with it)
        self.preexec_fn = preexec_fn
        self.per_node = 0
        self.argv: list[str] = []
        self.cwd: str | None = None
        self.env: dict[str, str] = {}
        self.standbys: list[Standby] = []
        #: node -> why it gets no standby (its standby died before it was ready)
        self.disabled: dict[str, str] = {}
        #: set when a node has fewer standbys than asked for
        self.wanted = asyncio.Event()
        self._spawned = 0

    def configure(self, per_node: int, argv: list[str], cwd: str | None, env: dict[str, str]):
        """A new run: its argv and environment (everything but the rank's own variables)."""
        self.per_node, self.argv, self.cwd, self.env = per_node, argv, cwd, env
        self.disabled = {}
        if per_node:
            self.wanted.set()

    def ready_pids(self) -> dict[str, list[int]]:
        ready: dict[str, list[int]] = {}
        for standby in self.standbys:
            if standby.ready and _alive(standby):
                ready.setdefault(standby.node, []).append(standby.process.pid)
        return ready

    def pids(self) -> dict[str, list[int]]:
        """Every live standby, ready or not (for ``goodput down`` if the actuator is gone)."""
        pids: dict[str, list[int]] = {}
        for standby in self.standbys:
            if _alive(standby):
                pids.setdefault(standby.node, []).append(standby.process.pid)
        return pids

    def take(self, node: str) -> Standby | None:
        """A ready, live standby of ``node``, now out of the pool (None: the rank starts cold,
        and the log says why)."""
        for standby in self.standbys:
            if standby.node == node and standby.ready and _alive(standby):
                self.standbys.remove(standby)
                standby.gone = True
                self.wanted.set()
                return standby
        if self.per_node:
            why = self.disabled.get(node) or "none is ready"
            log.warning("no standby to take on %s (%s): starting the rank cold", node, why)
        return None

    async def assign(self, standby: Standby, env: RankEnv) -> bool:
        """Hand ``env`` to ``standby``; False if it died meanwhile (its channel broke, or the
        write reached the socket of a process already exited), said in the log either way."""
        try:
            standby.writer.write(encode_assignment(env))
            await standby.writer.drain()
            problem = "" if _alive(standby) else f"exit {standby.process.returncode}"
        except (ConnectionError, OSError) as exc:
            problem = str(exc)
        if problem:
            log.warning(
                "standby %d of %s died before its assignment (%s): starting rank %d cold",
                standby.process.pid,
                standby.node,
                problem,
                env.rank,
            )
        return not problem

    async def replenish(self, nodes: list[str]) -> int:
        """Stop the standbys of nodes no longer in the job; start what ``nodes`` lack."""
        await self.stop([s.node for s in self.standbys if s.node not in nodes])
        return await self.fill(nodes)

    async def wait_ready(self, nodes: list[str], timeout_s: float) -> list[str]:
        """Wait until each of ``nodes`` has a ready standby, at most ``timeout_s``; returns
        the nodes still without one (their ranks will start cold)."""
        deadline = time.monotonic() + timeout_s
        while (cold := self._without_ready(nodes)) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        return cold

    def _without_ready(self, nodes: list[str]) -> list[str]:
        if not self.per_node:
            return []
        ready = {s.node for s in self.standbys if s.ready and _alive(s)}
        return [n for n in nodes if n not in ready and n not in self.disabled]

    async def fill(self, nodes: list[str]) -> int:
        """Start the standbys ``nodes`` lack; returns how many were started."""
        started = 0
        for node in nodes:
            if node in self.disabled:
                continue
            have = sum(1 for s in self.standbys if s.node == node and _alive(s))
            for _ in range(self.per_node - have):
                await self._spawn(node)
                started += 1
        return started

    async def stop(self, nodes: list[str] | None = None) -> None:
        """Stop the standbys of ``nodes`` (None: all) and wait until they are gone."""
        leaving = [s for s in self.standbys if nodes is None or s.node in nodes]
        for standby in leaving:
            self.standbys.remove(standby)
            standby.gone = True
            signal_group(standby.process.pid, signal.SIGKILL)
        await asyncio.gather(*(s.process.wait() for s in leaving))
        if leaving:
            self.wanted.set()

    async def _spawn(self, node: str) -> None:
        self._spawned += 1
        ours, theirs = socket.socketpair()
        self.logs.mkdir(parents=True, exist_ok=True)
        try:
            with open(self.logs / f"standby-{node}-{self._spawned:03d}.log", "ab") as out:
                process = await asyncio.create_subprocess_exec(
                    *self.argv,
                    cwd=self.cwd,
                    env=with_rank_boot(
                        {
                            **os.environ,
                            **self.env,
                            VARIABLES["node"]: node,
                            VARIABLES["standby"]: "1",
                        }
                    ),
                    stdin=theirs.fileno(),
                    stdout=out,
                    stderr=asyncio.subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=self.preexec_fn,
                )
        finally:
            theirs.close()
        reader, writer = await asyncio.open_unix_connection(sock=ours)
        standby = Standby(node=node, process=process, writer=writer)
        standby.watcher = untraced_task(self._watch(standby, reader))
        self.standbys.append(standby)
        log.info("standby %d of %s starting", process.pid, node)

    async def _watch(self, standby: Standby, reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(ConnectionError, OSError, ValueError):
            if await reader.readline() == READY and not standby.gone:
                standby.ready = True
                await self.changed(f"standby {standby.process.pid} of {standby.node} ready")
        code = await standby.process.wait()
        if standby.gone:
            return  # a rank now (its own watcher reports its exit), or stopped by the pool
        with contextlib.suppress(ValueError):
            self.standbys.remove(standby)
        if standby.ready:
            log.warning(
                "standby %d of %s died (exit %s); it will be replaced",
                standby.process.pid,
                standby.node,
                code,
            )
        else:
            why = f"a standby exited {code} before it was ready: does the job use run_job?"
            self.disabled[standby.node] = why
            log.error("no more standbys on %s: %s", standby.node, why)
        self.wanted.set()
        await self.changed(f"standby {standby.process.pid} of {standby.node} died")


def _alive(standby: Standby) -> bool:
    return standby.process.returncode is None and not standby.writer.is_closing()
