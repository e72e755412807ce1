"""Host health that exists on every node: checkpoint-volume space, memory, the node's rank processes."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import msgspec
import psutil

DEFAULT_DISK_MIN_FREE_BYTES = 256 << 20
DEFAULT_DISK_MIN_FREE_FRACTION = 0.01
DEFAULT_MEMORY_MIN_AVAILABLE_FRACTION = 0.05


class HostLimits(msgspec.Struct, kw_only=True, frozen=True):
    """Below these the node cannot keep training: checkpoints fail, or the OOM killer comes."""

    #: the checkpoint volume is full when free space is below this many bytes …
    disk_min_free_bytes: int = DEFAULT_DISK_MIN_FREE_BYTES
    #: … or below this fraction of its size
    disk_min_free_fraction: float = DEFAULT_DISK_MIN_FREE_FRACTION
    #: memory pressure when less than this fraction of RAM is available
    memory_min_available_fraction: float = DEFAULT_MEMORY_MIN_AVAILABLE_FRACTION


@dataclass
class DiskSample:
    free_bytes: int
    total_bytes: int
    full: bool


@dataclass
class MemorySample:
    available_bytes: int
    total_bytes: int
    pressure: bool


def existing_ancestor(path: Path) -> Path:
    """The volume may not exist before the first checkpoint: measure the filesystem it will be on."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def sample_disk(volume: Path, limits: HostLimits) -> DiskSample:
    usage = shutil.disk_usage(existing_ancestor(volume))
    full = (
        usage.free < limits.disk_min_free_bytes
        or usage.free < limits.disk_min_free_fraction * usage.total
    )
    return DiskSample(free_bytes=usage.free, total_bytes=usage.total, full=full)


def sample_memory(limits: HostLimits) -> MemorySample:
    memory = psutil.virtual_memory()
    pressure = memory.available < limits.memory_min_available_fraction * memory.total
    return MemorySample(
        available_bytes=memory.available, total_bytes=memory.total, pressure=pressure
    )


def rank_alive(pid: int, started_before_ns: int) -> bool:
    """The rank process still runs: it exists, is not a zombie, and its pid was not reused.

    A process that started after the job status naming it was written is someone else
    who received the recycled pid.
    """
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return False
        created_ns = int(process.create_time() * 1e9)
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True
    # create_time is rounded to clock ticks; allow a second of slack
    return created_ns <= started_before_ns + 1_000_000_000


def count_alive(pids: list[int], status_ts_ns: int) -> int:
    return sum(rank_alive(pid, status_ts_ns) for pid in pids)


def process_names(pids: list[int]) -> dict[int, str]:
    """The names of the processes among ``pids`` this host can see (for messages)."""
    names = {}
    for pid in pids:
        try:
            names[pid] = psutil.Process(pid).name()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, ValueError):
            continue
    return names
