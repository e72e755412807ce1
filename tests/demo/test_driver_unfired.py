"""A scenario fault whose moment never comes is recorded as failed, never skipped silently;
one whose moment comes while the job is between attempts waits for it to run again.

The demo once lost its follower on a NATS restart: the job finished while the driver still
waited for the second fault's step, and the demo reported the scenario as played.
"""

from __future__ import annotations

import asyncio
import time

from goodput import schemas
from goodput.tools.chaos.targets import ChaosError, RankTarget
from goodput.tools.demo.driver import Driver
from goodput.tools.demo.scenarios import SCENARIOS
from goodput.tools.stack.watch import JobWatcher


async def test_faults_the_job_ended_before_are_recorded_as_not_fired() -> None:
    watcher = JobWatcher(bus=None, job="demo", total_steps=300)  # type: ignore[arg-type]
    watcher.state, watcher.step = "finished", 300
    watcher.ended.set()
    scenario = SCENARIOS["kill-twice"]
    driver = Driver(ctx=None, watcher=watcher, scenario=scenario, steps=300)  # type: ignore[arg-type]
    await asyncio.wait_for(driver.run(), 5)
    assert [e.fault for e in driver.injected] == list(scenario.faults)
    assert not any(e.ok for e in driver.injected)
    first = driver.injected[0].as_dict()
    assert first["what"] == "not fired: due at step 75, the job ended finished at step 300"


async def test_a_cancelled_driver_records_what_it_did_not_fire() -> None:
    watcher = JobWatcher(bus=None, job="demo", total_steps=300)  # type: ignore[arg-type]
    driver = Driver(ctx=None, watcher=watcher, scenario=SCENARIOS["kill-twice"], steps=300)  # type: ignore[arg-type]
    running = asyncio.create_task(driver.run())
    await asyncio.sleep(0.2)  # waits: the job never ran
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)
    assert [e.ok for e in driver.injected] == [False, False]
    assert "was still starting at step 0" in driver.injected[0].detail


class RelaunchingRanks:
    """A chaos context whose job is between attempts at the first look (a relaunch took every
    rank away), as the real ``ChaosContext.rank`` then answers, and runs again after."""

    def __init__(self) -> None:
        self.looks = 0

    async def rank(self, rank: int | None) -> RankTarget:
        self.looks += 1
        if self.looks == 1:
            raise ChaosError("job demo has no live rank process")
        return RankTarget(rank=rank or 0, node="node-2", pid=1, injectable=True)


async def test_a_fault_whose_step_comes_during_a_relaunch_strikes_once_the_job_steps_again() -> (
    None
):
    """CI, under load: a straggler's hot swap stopped every rank just as the next fault's step
    came; the fault found no live rank and was lost, and the demo failed."""
    watcher = JobWatcher(bus=None, job="demo", total_steps=300)  # type: ignore[arg-type]
    watcher.last_status = schemas.JobStatus(
        job="demo", ts=0, state="running", attempt=4, world_size=2, procs_per_node=1
    )
    watcher.attempt = 4
    ctx = RelaunchingRanks()
    driver = Driver(ctx=ctx, watcher=watcher, scenario=SCENARIOS["kill-twice"], steps=300)  # type: ignore[arg-type]
    looking = asyncio.create_task(driver._node_of(SCENARIOS["kill-twice"].faults[0]))
    await asyncio.sleep(0.5)
    assert not looking.done() and ctx.looks == 1  # it waits for the job to step again
    watcher.last_step_at = time.monotonic()
    assert await asyncio.wait_for(looking, 5) == "node-2"
    assert driver.injected == []  # nothing recorded as not applied


async def test_a_fault_that_never_finds_its_rank_is_recorded_as_not_applied() -> None:
    class NoRanks:
        async def rank(self, rank: int | None) -> RankTarget:
            raise ChaosError("job demo has no live rank process")

    watcher = JobWatcher(bus=None, job="demo", total_steps=300)  # type: ignore[arg-type]
    watcher.ended.set()  # the job ends while the fault waits
    driver = Driver(ctx=NoRanks(), watcher=watcher, scenario=SCENARIOS["kill-twice"], steps=300)  # type: ignore[arg-type]
    assert await asyncio.wait_for(driver._node_of(SCENARIOS["kill-twice"].faults[0]), 5) is None
    assert [(e.ok, e.detail) for e in driver.injected] == [
        (False, "job demo has no live rank process")
    ]
