"""The local backend: a "node" is a group of rank processes on this machine.

Ranks are launched the way torchrun launches them (RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR/MASTER_PORT for the rendezvous), plus GOODPUT_* variables for the trainer shim.
Every remediation relaunches the worker group with a fresh rendezvous port: a collective
group cannot take back a rank that died, so "in-job restart" means new rank processes under
the same, still-running supervisor — or, for a job started with standbys and a command that
asks for them, ready standby processes (``goodput.supervisor.standby_pool``) handed the rank instead.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Awaitable
from pathlib import Path

import msgspec

from goodput import schemas
from goodput.bus import BusSettings
from goodput.bus.embedded import free_port
from goodput.bus.settings import FILE_FIELDS
from goodput.checkpoint.format import node_volume
from goodput.launch import capacity
from goodput.launch.rank_logs import rank_log
from goodput.state_dir import StateDir
from goodput.supervisor.membership import Membership, check_job_shape
from goodput.supervisor.rank_pids import write_rank_pids
from goodput.supervisor.rank_processes import (
    STOP_GRACE_S,
    RankProcess,
    spawn_rank,
    stop_ranks,
    watch,
)
from goodput.supervisor.standby_pool import StandbyPool
from goodput.telemetry import untraced_task
from goodput_services.actuator.backend import MembershipBackend
from goodput_services.actuator.ports import BusPorts
from goodput_services.actuator.strays import stop_strays

log = logging.getLogger(__name__)


#: how long a scale-up waits for a standby on each joining node (the job trains meanwhile)
STANDBY_WARM_S = 60.0


class LocalBackend(MembershipBackend[RankProcess]):
    """Launches, watches and replaces rank processes; reports every change as an event."""

    name = "local"
    #: standby processes on every node of the job, spares included (``goodput.supervisor.standby_pool``)
    standby_nodes = "all"
    stop_grace_s = STOP_GRACE_S

    def __init__(
        self,
        *,
        job: str,
        state_dir: Path,
        bus_settings: BusSettings,
        ports: BusPorts,
    ):
        # ranks run on this machine and see the same credential files; absolute paths, since a
        # rank's working directory is the job's, not the actuator's
        absolute = {
            name: os.path.abspath(getattr(bus_settings, name))
            for name in FILE_FIELDS
            if getattr(bus_settings, name)
        }
        super().__init__(
            job=job, bus_settings=msgspec.structs.replace(bus_settings, **absolute), ports=ports
        )
        self.state_dir = Path(state_dir)
        #: an attempt's ranks are being started: whether it finished is the launch's to say
        self._launching = False
        self.standbys = StandbyPool(StateDir(self.state_dir).standby_logs, self._report)
        self._keeper: asyncio.Task[None] | None = None

    # ---- commands ----------------------------------------------------------------------------

    async def start_job(self, spec: schemas.StartJob) -> str:
        async with self._lock:
            check_job_shape(spec)
            if spec.image or spec.gpus_per_rank is not None:
                raise RuntimeError(
                    "the local backend runs ranks as processes on its own machine: a job "
                    "naming an image or GPUs per rank needs --set backend=kubernetes"
                )
            # `goodput run` checked the shape; a StartJob from the bus may come from anyone
            problems = capacity.local_job_problems(
                nodes=spec.nodes,
                procs_per_node=spec.procs_per_node,
                spares=spec.spares,
                standbys=spec.standbys,
                host=capacity.read_host_facts(),
            )
            if problems:
                raise RuntimeError(f"this machine cannot run the job: {'; '.join(problems)}")
            await self._begin_run(spec)
            # the previous run's ranks have all exited, but they would still count as this
            # run's: in its pids (a host monitor would miss them) and in "every rank exited 0"
            await self._terminate(graceful=False, why="new run")
            await self.standbys.stop()
            self.membership = Membership.initial(spec.nodes, spec.spares, spec.procs_per_node)
            self.standbys.configure(
                spec.standbys, spec.argv, spec.workdir or None, self.standby_environment()
            )
            if spec.standbys and self._keeper is None:
                self._keeper = untraced_task(self._keep_standbys())
            await self._launch("starting", "job started")
            return (
                f"started {self.membership.world_size} ranks on {', '.join(self.membership.active)}"
            )

    # ---- in-process restart (the sequence is MembershipBackend.restart_in_process) ----------

    def _survivors(self) -> tuple[list[RankProcess], list[RankProcess]]:
        return [r for r in self.ranks if r.running], [r for r in self.ranks if not r.running]

    def _rendezvous(self, live: list[RankProcess]) -> tuple[str, int]:
        return "127.0.0.1", free_port()

    async def _start_again(
        self, dead: list[RankProcess], master_addr: str, master_port: int, standbys: bool
    ) -> None:
        """Each dead rank a new process, or its node's ready standby (with ``standbys``)."""
        assert self.membership is not None
        for entry in dead:
            self.ranks.remove(entry)
            node_index = self.membership.node_index(entry.node)
            await self._start_rank(
                entry.node, node_index, entry.rank, entry.local_rank, master_port, standbys
            )

    async def shutdown(self) -> None:
        await super().shutdown()
        if self._keeper is not None:
            self._keeper.cancel()
            self._keeper = None

    # ---- standbys ----------------------------------------------------------------------------

    async def _keep_standbys(self) -> None:
        """Start the standbys the nodes lack, once the job trains again after a launch or a
        death: started together with the ranks they would slow their start-up down."""
        while True:
            await self.standbys.wanted.wait()
            if self.ports.next_step is not None:
                await self.ports.next_step()
            else:
                await asyncio.sleep(1.0)
            async with self._lock:
                if self.state != "running" or self.membership is None:
                    continue
                self.standbys.wanted.clear()
                nodes = [*self.membership.active, *self.membership.spares]
                if await self.standbys.replenish(nodes):
                    await self._report("standbys replenished")

    def _standby_pids(self) -> dict[str, list[int]]:
        return self.standbys.ready_pids()

    async def _release_standbys(self, nodes: list[str] | None) -> None:
        await self.standbys.stop(nodes)

    async def _warm_standbys(self, nodes: list[str]) -> None:
        if not nodes:
            return
        async with self._lock:  # the keeper fills under it too: no node gets two
            await self.standbys.fill(nodes)
        cold = await self.standbys.wait_ready(nodes, STANDBY_WARM_S)
        if cold:
            log.warning(
                "no ready standby on %s within %.0f s: their ranks start cold",
                ", ".join(cold),
                STANDBY_WARM_S,
            )

    async def return_node(self, node: str) -> str:
        done = await super().return_node(node)
        self.standbys.wanted.set()  # a spare again: it keeps standbys for the next hot swap
        return done

    # ---- machinery ---------------------------------------------------------------------------

    def _pids(self) -> dict[str, list[int]]:
        pids: dict[str, list[int]] = {}
        # in rank order: a standby handed a rank has no RANK in its environment, and chaos
        # tells its rank by its place here
        for rank in sorted(self.ranks, key=lambda r: r.rank):
            pids.setdefault(rank.node, []).append(rank.process.pid)
        return pids

    def volume(self, node: str) -> Path:
        """The node's local checkpoint volume (what a local SSD is on a real node)."""
        return node_volume(self.state_dir, node, self.job)

    @property
    def ranks_file(self) -> Path:
        """Rank pids on disk, so `goodput down` can stop them even if this process was killed."""
        return StateDir(self.state_dir).ranks_record(self.job)

    async def _report(self, detail: str) -> None:
        status = self.status(detail)
        self._record_pids(status)
        await self.emit(status)

    def _record_pids(self, status: schemas.JobStatus) -> None:
        # standbys too: `goodput down` stops whatever the actuator started if it is gone
        processes = {n: [*status.pids.get(n, []), *p] for n, p in self.standbys.pids().items()}
        write_rank_pids(self.ranks_file, {**status.pids, **processes})

    async def _terminate(self, *, graceful: bool, why: str) -> None:
        ranks, self.ranks = self.ranks, []
        await stop_ranks(ranks, why, STOP_GRACE_S if graceful else 0)

    async def _launch(
        self, state: schemas.JobStateName, detail: str, standbys: bool = False
    ) -> None:
        assert self.spec is not None and self.membership is not None
        self.attempt += 1
        await self._prepare_volumes()
        port = free_port()
        membership = self.membership
        self._launching = True
        try:
            for node_index, node in enumerate(membership.active):
                for local_rank in range(membership.procs_per_node):
                    rank = node_index * membership.procs_per_node + local_rank
                    await self._start_rank(node, node_index, rank, local_rank, port, standbys)
        except (OSError, RuntimeError) as exc:
            raise RuntimeError(await self._abandon_launch(exc)) from exc
        finally:
            self._launching = False
        if await self._launched(state, "every rank exited 0"):
            await self._report(detail)

    async def _abandon_launch(self, cause: BaseException) -> str:
        """A launch that could not start every rank (no thread, no fork, no log file) stops
        what it started, strays of the failed spawn included, so no rank is left that
        `goodput down` would not know of; the job fails. Says why, for the command's
        ActionResult, which reports it: a "failed" JobStatus before it would end `goodput
        run` as a failed job, not as the launch failure it is."""
        assert self.membership is not None
        started = len(self.ranks)
        await self._terminate(graceful=False, why="launch failed")
        # the pool's processes, live or not yet reaped, are its own to wait for
        strays = stop_strays({standby.process.pid for standby in self.standbys.standbys})
        self.state = "failed"
        stopped = " and ".join(
            part
            for part in (
                f"{started} started" * bool(started),
                f"{len(strays)} half-started" * bool(strays),
            )
            if part
        )
        why = (
            f"launch of attempt {self.attempt} failed after starting {started} of "
            f"{self.membership.world_size} rank(s): {type(cause).__name__}: {cause}"
            + (f"; stopped {stopped}" if stopped else "")
        )
        self._record_pids(self.status(why))
        return why

    async def _start_rank(
        self,
        node: str,
        node_index: int,
        rank: int,
        local_rank: int,
        port: int,
        standbys: bool,
    ) -> None:
        """One rank of the current attempt: a ready standby of its node told to be it (when
        ``standbys``), else a new process."""
        standby = self.standbys.take(node) if standbys else None
        if standby is not None:
            env = self.rank_env(
                node=node,
                node_index=node_index,
                rank=rank,
                local_rank=local_rank,
                master_addr="127.0.0.1",
                master_port=port,
                volume=self.volume(node),
                device=self._device(node_index, local_rank),
            )
            if await self.standbys.assign(standby, env):
                log.info("rank %d on %s: standby %d", rank, node, standby.process.pid)
                await self._watch_rank(node, rank, local_rank, standby.process)
                return
        await self._spawn(node, node_index, rank, local_rank, port)

    async def _spawn(
        self, node: str, node_index: int, rank: int, local_rank: int, port: int
    ) -> None:
        """Start one rank of the current attempt as a new process."""
        assert self.spec is not None
        process = await spawn_rank(
            self.spec.argv,
            env=self._rank_env(node, node_index, rank, local_rank, port),
            cwd=self.spec.workdir or None,
            output=rank_log(self.state_dir, self.attempt, node, rank),
        )
        await self._watch_rank(node, rank, local_rank, process)

    async def _watch_rank(
        self, node: str, rank: int, local_rank: int, process: asyncio.subprocess.Process
    ) -> None:
        """``process`` is a rank of the current attempt from now on: watch it, and say so."""
        assert self.membership is not None
        entry = RankProcess(
            node=node, rank=rank, local_rank=local_rank, attempt=self.attempt, process=process
        )
        watch(entry, self.job, self.emit, self._exit_seen)
        self.ranks.append(entry)
        await self.emit(
            schemas.RankStarted(
                job=self.job,
                node=node,
                rank=rank,
                local_rank=local_rank,
                world_size=self.membership.world_size,
                pid=process.pid,
                attempt=self.attempt,
            )
        )

    def _rank_env(
        self, node: str, node_index: int, rank: int, local_rank: int, port: int
    ) -> dict[str, str]:
        return self.rank_environment(
            node=node,
            node_index=node_index,
            rank=rank,
            local_rank=local_rank,
            master_addr="127.0.0.1",
            master_port=port,
            volume=self.volume(node),
            device=self._device(node_index, local_rank),
        )

    def _device(self, node_index: int, local_rank: int) -> int:
        """The GPU a rank binds where it has one: every local node is this machine, so its
        local rank alone would bind node 1's ranks to node 0's GPUs (``start_job`` refused a
        shape with more ranks than GPUs)."""
        assert self.membership is not None
        return node_index * self.membership.procs_per_node + local_rank

    def _exit_seen(self, entry: RankProcess) -> Awaitable[None] | None:
        """The attempt is finished when this exit completes it: decided at the exit, so exactly
        one exit finds it complete; mid-launch a "running" status would follow the
        "finished" one, so the launch says it instead."""
        if entry in self.ranks and not self._launching and self._finished():
            return self._all_exited_0()
        return None

    async def _all_exited_0(self) -> None:
        self.state = "finished"
        await self._report("every rank exited 0")

    def _finished(self) -> bool:
        """Every rank of the current attempt was seen exiting 0."""
        return bool(self.ranks) and all(r.exited and r.process.returncode == 0 for r in self.ranks)
