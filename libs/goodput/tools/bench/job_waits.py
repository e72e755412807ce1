"""What ``goodput bench recovery`` waits for in a job's events: the job steady, a checkpoint
held by every rank, each rank's restore, and the job's pace while nothing else happens.

Every wait reads the events a :class:`~goodput.bus.job_events.JobEvents` log gathers and gives
up only after ``WAIT_S`` without the ranks making progress (a loaded machine starts ranks in
minutes, not seconds).
"""

from __future__ import annotations

import asyncio
import statistics
import time

from goodput import schemas
from goodput.bus.job_events import JobEvents

#: how long each awaited event may take before the job counts as not recovering
WAIT_S = 120.0
#: events that show the ranks starting or training (service health events do not count)
PROGRESS = (schemas.RankStarted, schemas.StepDone, schemas.CheckpointSaved)


def newest_held_by_all(events: list[schemas.Event], world_size: int, before_ts: int) -> int:
    """The newest step every rank reported persisted at or before ``before_ts`` (-1: none)."""
    ranks_by_step: dict[int, set[int]] = {}
    for event in events:
        if isinstance(event, schemas.CheckpointPersisted) and event.ts <= before_ts:
            ranks_by_step.setdefault(event.step, set()).add(event.rank)
    full = [step for step, ranks in ranks_by_step.items() if len(ranks) >= world_size]
    return max(full, default=-1)


async def held_after(log: JobEvents, world_size: int, after_ts: int) -> int:
    """The newest step persisted by every rank in events stamped after ``after_ts``.

    Starting ranks and their first steps take minutes on a loaded machine: the wait gives up
    only after ``WAIT_S`` without the ranks making progress, not after a fixed time."""
    deadline, seen = time.monotonic() + WAIT_S, 0
    while time.monotonic() < deadline:
        events = log.events[:]
        progress = sum(isinstance(e, PROGRESS) for e in events)
        if progress > seen:
            deadline, seen = time.monotonic() + WAIT_S, progress
        step = newest_held_by_all([e for e in events if e.ts > after_ts], world_size, 2**63)
        if step >= 0:
            return step
        await asyncio.sleep(0.02)
    raise TimeoutError(
        f"no checkpoint persisted by all {world_size} ranks, and no progress for {WAIT_S:g} s"
    )


async def restores_after(log: JobEvents, world_size: int, after_ts: int) -> dict[int, str]:
    """The tier each rank restored from in events stamped after ``after_ts``, once every rank
    has restored (its first restore after that moment). A node's volume filled before its
    ranks start reports rank -1: not a rank's restore."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        tiers: dict[int, str] = {}
        for event in log.events[:]:
            if (
                isinstance(event, schemas.CheckpointRestored)
                and event.ts > after_ts
                and 0 <= event.rank < world_size
            ):
                tiers.setdefault(event.rank, event.tier)
        if len(tiers) >= world_size:
            return dict(sorted(tiers.items()))
        await asyncio.sleep(0.02)
    raise TimeoutError(f"not every one of {world_size} ranks restored within {WAIT_S:g} s")


def survivors_after(events: list[schemas.Event], after_ts: int) -> list[int]:
    """The ranks that restarted in process (kept their process and memory) after ``after_ts``."""
    return sorted(
        {e.rank for e in events if isinstance(e, schemas.RankRejoined) and e.ok and e.ts > after_ts}
    )


def newest_status(log: JobEvents) -> schemas.JobStatus:
    return next(
        e
        for e in reversed(log.events[:])
        if isinstance(e, schemas.JobStatus) and e.state == "running"
    )


#: how long the job steps undisturbed for its pace: ~40 steps of the example job when quiet
PACE_S = 8.0


async def pace_step_s(log: JobEvents, standbys: bool) -> float:
    """The job's median step while nothing else happens: running, a checkpoint held by every
    rank (its first saves, which allocate their buffers, done) and, with ``standbys``, a ready
    standby on every active node (one being built shares the CPUs with the ranks), then
    ``PACE_S`` of steps. A run's median step over this is the load it met against the
    benchmark's (``goodput simulate predict``); the trials' steps cannot say it, most of them
    being taken beside a rank or a standby starting."""
    status = await log.wait_for(
        lambda e: isinstance(e, schemas.JobStatus) and e.state == "running", WAIT_S, "the job"
    )
    assert isinstance(status, schemas.JobStatus)
    await held_after(log, status.world_size, status.ts)
    if standbys:
        await log.wait_for(
            lambda e: (
                isinstance(e, schemas.JobStatus)
                and all(e.standbys.get(node) for node in e.active_nodes)
            ),
            WAIT_S,
            "a ready standby on every node",
        )
    began = schemas.now_ns()
    await asyncio.sleep(PACE_S)
    times = [
        e.step_time_s
        for e in log.events[:]
        if isinstance(e, schemas.StepDone) and e.rank == 0 and e.ts > began
    ]
    if not times:
        raise TimeoutError(f"the job made no step in {PACE_S:g} s of measuring its pace")
    return round(statistics.median(times), 4)
