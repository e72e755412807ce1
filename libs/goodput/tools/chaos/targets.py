"""Where the chaos tool finds its targets: only the project's own job and processes.

Rank processes come from the actuator's job status (KV ``gp_state``, ``<job>.job_status``;
its ranks file in the state directory when the bus is away), and every pid is checked
against the process's own environment (``GOODPUT_JOB``, ``RANK``, ``GOODPUT_NODE``, set by
the actuator) before it is signalled, so a recycled pid is never hit. Services and the
embedded NATS server come from ``stack.json`` / ``nats.json``, checked against their recorded
identities (pid, start time, command line; :mod:`goodput.owned_process`).
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import nats.js.errors
import psutil

from goodput import schemas, subjects
from goodput.bus import Bus, BusSettings, BusSettingsError
from goodput.bus.client import TRANSIENT_ERRORS, BusUnavailableError
from goodput.bus.embedded import read_record
from goodput.checkpoint.format import node_volume
from goodput.launch.rank_env import VARIABLES
from goodput.owned_process import RecordUnreadable
from goodput.state_dir import StateDir
from goodput.subjects import DEFAULT_JOB
from goodput.supervisor.rank_pids import read_rank_pids
from goodput.tools.stack.record import StackRecord, read_stack


class ChaosError(RuntimeError):
    """A fault that cannot be applied (no such target, nothing to act on)."""


#: the job's status cannot be read: no bus, no status yet, or the bus away for now
_NO_STATUS: tuple[type[BaseException], ...] = (
    ChaosError,
    nats.js.errors.KeyNotFoundError,
    *TRANSIENT_ERRORS,
)


@dataclass(frozen=True)
class RankTarget:
    rank: int
    node: str
    pid: int
    #: the rank was started with the trainer's fault injection enabled
    injectable: bool


@dataclass
class ChaosContext:
    """The job under test: its state directory, bus and a seeded choice of random targets."""

    state_dir: Path
    job: str
    settings: BusSettings
    rng: random.Random = field(default_factory=random.Random)
    stack: StackRecord | None = None
    _bus: Bus | None = None
    #: why the bus could not be reached (not retried: every fault would wait for it again)
    _bus_error: str = ""

    @property
    def paths(self) -> StateDir:
        """The files of the stack under test."""
        return StateDir(self.state_dir)

    @classmethod
    def open(
        cls,
        state_dir: Path,
        *,
        job: str = "",
        url: str = "",
        settings: BusSettings | None = None,
        seed: int | None = None,
    ) -> ChaosContext:
        """The job of the stack in ``state_dir``; the bus is ``url``, else the stack's."""
        state_dir = Path(state_dir).resolve()
        stack = read_stack(state_dir)
        job = job or (stack.job if stack else DEFAULT_JOB)
        subjects.check_token(job, "job name")
        if not url:
            record = read_record(StateDir(state_dir))
            url = stack.url if stack else (record.url if record else "")
        settings = msgspec.structs.replace(settings or BusSettings(), url=url)
        return cls(state_dir, job, settings, rng=random.Random(seed), stack=stack)

    # ---- bus -----------------------------------------------------------------------------------

    async def bus(self) -> Bus:
        if self._bus is None:
            if not self.settings.url:
                self._bus_error = (
                    f"no bus: no stack in {self.state_dir} (start one with `goodput up`) "
                    "and no --nats-url"
                )
            if self._bus_error:
                raise ChaosError(self._bus_error)
            try:
                self._bus = await Bus.connect(
                    self.settings, name="goodput-chaos", initial_timeout_s=10
                )
            except (BusUnavailableError, BusSettingsError) as exc:  # one line, no traceback
                self._bus_error = str(exc)
                raise ChaosError(self._bus_error) from exc
        return self._bus

    async def close(self) -> None:
        if self._bus is not None:
            await self._bus.close()
            self._bus = None

    # ---- the job -------------------------------------------------------------------------------

    async def job_status(self) -> schemas.JobStatus | None:
        try:
            bus = await self.bus()
            kv = await bus.kv(subjects.STATE_BUCKET)
            entry = await asyncio.wait_for(
                kv.get(subjects.kv_key(self.job, "job_status")), timeout=3
            )
        except _NO_STATUS:
            return None
        status = schemas.decode_event(entry.value or b"")
        return status if isinstance(status, schemas.JobStatus) else None

    async def rank_pids(self) -> dict[str, list[int]]:
        """Rank pids per node: the job status in KV, else the actuator's ranks file."""
        status = await self.job_status()
        if status is not None:
            return status.pids
        try:
            return read_rank_pids(self.paths.ranks_record(self.job))
        except RecordUnreadable as exc:
            raise ChaosError(str(exc.code)) from None

    async def ranks(self, node: str | None = None) -> list[RankTarget]:
        """Live rank processes of the job (of one node), verified through their environment."""
        found = []
        status = await self.job_status()
        for listed_node, pids in (await self.rank_pids()).items():
            if node is not None and listed_node != node:
                continue
            for position, pid in enumerate(pids):
                process = self._verified_rank(
                    pid, listed_node, _rank_at(status, listed_node, position)
                )
                if process is not None:
                    found.append(process)
        return sorted(found, key=lambda p: p.rank)

    def _verified_rank(self, pid: int, node: str, listed_rank: int | None) -> RankTarget | None:
        """``listed_rank``: the rank the job status lists ``pid`` as, for a standby handed a
        rank, whose environment (read here) predates its assignment."""
        try:
            process = psutil.Process(pid)
            if process.status() == psutil.STATUS_ZOMBIE:
                return None
            env = process.environ()
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            return None
        except psutil.AccessDenied as exc:
            raise ChaosError(f"cannot verify pid {pid} is a rank of job {self.job}: {exc}") from exc
        if env.get("GOODPUT_JOB") != self.job or env.get("GOODPUT_NODE") != node:
            return None  # the pid was recycled by another process
        try:
            rank = int(env["RANK"])
        except (KeyError, ValueError):
            if env.get(VARIABLES["standby"]) != "1" or listed_rank is None:
                return None
            rank = listed_rank
        return RankTarget(
            rank=rank,
            node=node,
            pid=pid,
            injectable=env.get("GOODPUT_ENABLE_FAULT_INJECTION", "") in ("1", "true", "yes"),
        )

    async def rank(self, rank: int | None) -> RankTarget:
        """One live rank (``None``: a random one)."""
        ranks = await self.ranks()
        if not ranks:
            raise ChaosError(f"job {self.job} has no live rank process")
        if rank is None:
            return self.rng.choice(ranks)
        for process in ranks:
            if process.rank == rank:
                return process
        alive = ", ".join(str(p.rank) for p in ranks)
        raise ChaosError(f"rank {rank} of job {self.job} is not running (live ranks: {alive})")

    async def node(self, node: str | None) -> str:
        """A node of the job (``None``: a random active one)."""
        status = await self.job_status()
        nodes = list(status.active_nodes) if status is not None else []
        if not nodes and self.stack is not None:
            nodes = list(self.stack.nodes)
        if node is not None:
            subjects.check_token(node, "node name")
            return node
        if not nodes:
            raise ChaosError(f"no node of job {self.job} known: is the job running?")
        return self.rng.choice(nodes)

    def volume(self, node: str) -> Path:
        return node_volume(self.state_dir, node, self.job)


def _rank_at(status: schemas.JobStatus | None, node: str, position: int) -> int | None:
    """The rank at ``position`` of ``node``'s pids in ``status`` (listed in rank order)."""
    if status is None or node not in status.active_nodes:
        return None
    return status.active_nodes.index(node) * status.procs_per_node + position
