"""How big a job (and a local stack) may be: documented maxima, and what this machine can run.

The decision (:func:`job_problems`, :func:`local_job_problems`, :func:`local_stack_problems`)
is pure: the machine's facts (:class:`HostFacts`) are passed in, and the reasons a shape is
refused are returned, so the CLI refuses it in one line before anything starts and the local
actuator refuses a forged ``StartJob`` the same way. :func:`read_host_facts` is the one effect.

On the local backend every rank, standby and per-node service is a process of this machine:
a shape past the process limit used to fork until ``fork`` or ``pthread_create`` failed,
half-started.
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass
from pathlib import Path

from goodput import schemas

#: the most nodes (active plus spares) a job may name on any backend: 16,384 GPUs at 8 per
#: node is 2,048 nodes; twice that leaves room, and a typo (``--nodes 20000``) is refused
MAX_NODES = 4096
#: the most ranks per node on any backend (8 GPUs per node is usual; 64 covers CPU ranks)
MAX_PROCS_PER_NODE = 64
#: the most rank and standby processes a local job may run on one machine
MAX_LOCAL_PROCESSES = 256
#: the most local nodes a stack may serve (each runs a host monitor and a checkpoint tier)
MAX_LOCAL_NODES = 64
#: service processes a local node adds to the stack (host monitor, checkpoint tier)
SERVICES_PER_LOCAL_NODE = 2
#: local processes per CPU: one rank per CPU is what training wants; 8 is as far as a test or
#: demo oversubscribes before its ranks wait on the scheduler more than they train
PROCESSES_PER_CPU = 8
#: what one local rank needs in memory, an estimate: importing torch (CPU) alone is ~220 MiB
#: resident, and the rank adds its model, optimizer and the shim's host-memory checkpoint
RANK_MEMORY_BYTES = 512 * 2**20
#: threads one local rank runs (torch's intra-op pool, gloo, the shim's bus client): what it
#: takes from the per-user process limit, which counts threads
THREADS_PER_RANK = 32


@dataclass(frozen=True)
class HostFacts:
    """What this machine can run, read once by :func:`read_host_facts` (tests pass their own)."""

    cpus: int
    #: memory available to new processes (``MemAvailable``), bytes
    available_memory_bytes: int
    #: threads this user may still start: the lower of ``RLIMIT_NPROC`` and
    #: ``kernel.threads-max``, less the threads running now
    thread_headroom: int
    #: GPUs visible here (0: none); ranks that see a GPU use NCCL, one GPU per local rank
    gpus: int


def job_problems(*, nodes: int, procs_per_node: int, spares: int, standbys: int) -> list[str]:
    """Why a job of this shape is refused on any backend (empty: it is not)."""
    problems = []
    if nodes + spares > MAX_NODES:
        problems.append(f"{nodes} node(s) + {spares} spare(s) exceed the maximum of {MAX_NODES}")
    if procs_per_node > MAX_PROCS_PER_NODE:
        problems.append(
            f"{procs_per_node} ranks per node exceed the maximum of {MAX_PROCS_PER_NODE}"
        )
    if standbys > schemas.MAX_STANDBYS_PER_NODE:
        problems.append(
            f"{standbys} standbys per node exceed the maximum of {schemas.MAX_STANDBYS_PER_NODE}"
        )
    return problems


def local_job_problems(
    *, nodes: int, procs_per_node: int, spares: int, standbys: int, host: HostFacts
) -> list[str]:
    """Why this machine cannot run a local job of this shape: every node, spares included,
    may come to run ``procs_per_node`` ranks (a hot swap starts a spare's) and keeps
    ``standbys`` ready processes."""
    problems = job_problems(
        nodes=nodes, procs_per_node=procs_per_node, spares=spares, standbys=standbys
    )
    if problems:
        return problems
    processes = (nodes + spares) * (procs_per_node + standbys)
    shape = f"{nodes + spares} local node(s) x ({procs_per_node} rank(s) + {standbys} standby(s))"
    problems += _machine_problems(processes, f"{shape} = {processes} processes", host)
    # every local node is this machine: its active nodes' ranks run here together (a spare's
    # take the place of a stopped node's), each on a GPU of its own
    return problems + gpu_problems(nodes * procs_per_node, {"this machine": host.gpus})


def gpu_problems(ranks_per_host: int, gpus: dict[str, int]) -> list[str]:
    """Ranks that see a GPU use NCCL, which refuses two ranks on one GPU: the hosts (name ->
    GPUs they declare; 0: none, CPU ranks) with fewer GPUs than the ``ranks_per_host`` that
    would run there together."""
    short = sorted(host for host, count in gpus.items() if 0 < count < ranks_per_host)
    if not short:
        return []
    named = ", ".join(f"{host} ({gpus[host]})" for host in short[:4])
    more = f" and {len(short) - 4} more" if len(short) > 4 else ""
    return [
        f"{ranks_per_host} ranks on a host but fewer GPUs on {named}{more}: NCCL needs a GPU "
        "per rank (nodes sharing a machine x --procs-per-node at most its GPU count)"
    ]


def rank_device(
    local_rank: int, local_world_size: int, visible: int, assigned: int | None = None
) -> int:
    """The CUDA device a rank binds, never one another rank of its host binds: the one its
    launcher assigned (``RankEnv.device``: local nodes sharing one machine), else its local
    rank; a process that sees a single GPU (a pod holding its own) takes that one. Raises
    :class:`DeviceSharingError` (one line) where the index is past the GPUs it sees, which
    would bind two ranks to one GPU (``local_rank % count`` did)."""
    if assigned is None and visible == 1:
        return 0
    index = local_rank if assigned is None else assigned
    if 0 <= index < visible:
        return index
    whose = (
        f"device {assigned} assigned to local rank {local_rank}"
        if assigned is not None
        else (f"local rank {local_rank} of {local_world_size}")
    )
    raise DeviceSharingError(
        f"{whose} but this process sees {visible} GPU(s): ranks would share a GPU, which NCCL "
        "refuses (give each rank a GPU of its own: fewer ranks per host)"
    )


class DeviceSharingError(ValueError):
    """A rank's device would be another rank's: the message is one line for the user."""


def local_stack_problems(*, nodes: int, host: HostFacts) -> list[str]:
    """Why this machine cannot serve ``nodes`` local nodes (``goodput up --nodes``)."""
    if nodes > MAX_LOCAL_NODES:
        return [f"{nodes} local nodes exceed the maximum of {MAX_LOCAL_NODES}"]
    processes = nodes * SERVICES_PER_LOCAL_NODE
    return _machine_problems(processes, f"{nodes} local node(s)' {processes} services", host)


def _machine_problems(processes: int, what: str, host: HostFacts) -> list[str]:
    """What this machine lacks for ``processes`` more processes, in one reason (or none)."""
    lacks = []
    if processes > MAX_LOCAL_PROCESSES:
        lacks.append(f"more than the maximum of {MAX_LOCAL_PROCESSES} on one machine")
    elif processes > host.cpus * PROCESSES_PER_CPU:
        lacks.append(f"more than {PROCESSES_PER_CPU} per CPU of this machine's {host.cpus} CPU(s)")
    if processes * RANK_MEMORY_BYTES > host.available_memory_bytes:
        lacks.append(
            f"about {processes * RANK_MEMORY_BYTES / 2**30:.1f} GiB of memory, "
            f"{host.available_memory_bytes / 2**30:.1f} GiB available"
        )
    if processes * THREADS_PER_RANK > host.thread_headroom:
        lacks.append(
            f"about {processes * THREADS_PER_RANK} threads, {max(host.thread_headroom, 0)} "
            "more allowed (ulimit -u, kernel.threads-max)"
        )
    return [f"{what}: {', '.join(lacks)}"] if lacks else []


def read_host_facts() -> HostFacts:
    """This machine's :class:`HostFacts` (Linux ``/proc``; elsewhere, what it can tell)."""
    return HostFacts(
        cpus=len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else os.cpu_count() or 1,
        available_memory_bytes=_available_memory(),
        thread_headroom=_thread_headroom(),
        gpus=_visible_gpus(),
    )


def _available_memory() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _thread_headroom() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    limits = [soft] if soft != resource.RLIM_INFINITY else []
    try:
        limits.append(int(Path("/proc/sys/kernel/threads-max").read_text()))
        # "runnable/total" scheduling entities: every thread of every user (an upper bound
        # on this user's, so the headroom errs on the safe side)
        running = int(Path("/proc/loadavg").read_text().split()[3].split("/")[1])
    except (OSError, ValueError, IndexError):
        running = 0
    return (min(limits) if limits else 2**31) - running


def _visible_gpus() -> int:
    """GPUs a rank started here would see, without importing torch or CUDA."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    try:
        return len(list(Path("/proc/driver/nvidia/gpus").iterdir()))
    except OSError:
        return 0
