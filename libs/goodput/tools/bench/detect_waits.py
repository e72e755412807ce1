"""What `goodput bench detect`'s phases wait for in the job's events (``JobEvents``): the job
settled and stepping on its nodes, a signal, a resumed attempt, and the figures read off its
step reports (rank 0's). Shared by the fault phases (``detect.py``) and the numerical ones
(``detect_numerics.py``).
"""

from __future__ import annotations

import asyncio

from goodput import schemas
from goodput.bus.job_events import JobEvents
from goodput.tools.bench.job_waits import WAIT_S

#: how often a wait looks at the events again
LOOK_S = 0.5


def _settled_since(log: JobEvents, ts: int) -> bool:
    stepped = False
    for event in reversed(log.events):
        if event.ts < ts:
            break
        if isinstance(event, schemas.RankStarted | schemas.RankExited):
            return False
        stepped = stepped or (isinstance(event, schemas.StepDone) and event.rank == 0)
    return stepped


class BenchError(Exception):
    """The benchmark cannot go on; its message is the one line the user sees."""


async def stepping_on(log: JobEvents, nodes: int, timeout_s: float = WAIT_S) -> schemas.JobStatus:
    """The job's current status once it runs on ``nodes`` nodes whose ranks step again.

    A status read while the job relaunches (a remediation of a previous fault, or of a false
    positive) names ranks that are exiting, or fewer nodes after an eviction that found no
    spare: wait for a running status with every active node's ranks, no rank started or exited
    since, and a step of rank 0 after it.
    """
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        status = next((e for e in reversed(log.events) if isinstance(e, schemas.JobStatus)), None)
        if (
            status is not None
            and status.state == "running"
            and len(status.active_nodes) >= nodes
            and all(status.pids.get(node) for node in status.active_nodes)
            and _settled_since(log, status.ts)
        ):
            return status
        if status is not None and status.state in schemas.ENDED_JOB_STATES:
            raise BenchError(
                f"the job is {status.state} ({status.detail}); nothing left to measure"
            )
        if asyncio.get_running_loop().time() >= deadline:
            seen = (
                f"{status.state} on {len(status.active_nodes)} node(s) ({status.detail})"
                if status
                else "no job status"
            )
            raise BenchError(
                f"the job did not run on {nodes} stepping nodes within {timeout_s:g} s; "
                f"last status: {seen}"
            )
        await asyncio.sleep(LOOK_S)


def step_of(log: JobEvents) -> int:
    """Rank 0's newest reported step (0: none yet)."""
    return next(
        (e.step for e in reversed(log.events) if isinstance(e, schemas.StepDone) and e.rank == 0),
        0,
    )


async def after_resume(log: JobEvents, since_ts: int, steps: int = 15) -> None:
    """Wait until the job runs a new attempt and made ``steps`` steps in it."""
    restarted = await log.wait_for(
        lambda e: isinstance(e, schemas.JobStatus) and e.state == "running",
        WAIT_S,
        "the job running again",
        after_ts=since_ts,
    )
    first = await log.wait_for(
        lambda e: isinstance(e, schemas.StepDone) and e.rank == 0,
        WAIT_S,
        "the first step after resume",
        after_ts=restarted.ts,
    )
    assert isinstance(first, schemas.StepDone)  # the only kind its predicate matches
    await log.wait_for(
        lambda e: isinstance(e, schemas.StepDone) and e.rank == 0 and e.step >= first.step + steps,
        WAIT_S,
        f"{steps} steps after resume",
        after_ts=first.ts,
    )


async def signal_after(log: JobEvents, kind: str, since_ts: int, timeout_s: float = 120.0):
    return await log.wait_for(
        lambda e: isinstance(e, schemas.Signal) and e.signal == kind,
        timeout_s,
        f"a {kind} signal",
        after_ts=since_ts,
    )


def step_times(log: JobEvents, last: int | None = None) -> dict[str, float]:
    """Rank 0's step time (s), median and 95th percentile: over every step so far, or its
    ``last`` steps (the hang timeout is a few of them)."""
    times = [e.step_time_s for e in log.events if isinstance(e, schemas.StepDone) and e.rank == 0]
    times = sorted(times[-last:] if last else times)
    if not times:
        return {}
    return {
        "median": round(times[len(times) // 2], 3),
        "p95": round(times[int(0.95 * (len(times) - 1))], 3),
    }


def step_at(log: JobEvents, ts: int) -> int:
    return max(
        (
            e.step
            for e in log.events
            if isinstance(e, schemas.StepDone) and e.rank == 0 and e.ts <= ts
        ),
        default=0,
    )
