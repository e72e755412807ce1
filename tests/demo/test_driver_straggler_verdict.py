"""The fault after a straggler waits for the sensor's verdict on it.

CI (a quiet machine, the e2e demo's 400 steps): the next fault was due 64 steps after the
straggler, 27 s of 3× slowed steps; the sensor needs 11 slowed steps and its 20 s hold to flag
one, so the node loss came first, its hot swap replaced the straggler unflagged, and the run
never showed an eviction. Here the driver runs against a chaos context whose rank is a named
fake (``SlowingContext``: it records the shim's slow commands and never ends them itself).
"""

from __future__ import annotations

import asyncio
import time

from goodput import schemas
from goodput.tools.chaos.targets import RankTarget
from goodput.tools.demo.driver import Driver
from goodput.tools.demo.scenarios import SCENARIOS, DemoFault
from goodput.tools.stack.watch import JobWatcher

STRAGGLER = next(f for f in SCENARIOS["full"].faults if f.action == "slow-rank")


class RecordingBus:
    def __init__(self) -> None:
        self.commands: list[schemas.InjectFault] = []

    async def send_command(self, subject: str, command: schemas.InjectFault, **_: object) -> None:
        self.commands.append(command)


class SlowingContext:
    """A chaos context whose rank 1 runs on node-1 with fault injection on."""

    job = "demo"

    def __init__(self) -> None:
        self.recorded = RecordingBus()

    async def rank(self, rank: int | None) -> RankTarget:
        return RankTarget(rank=rank or 0, node="node-1", pid=1, injectable=True)

    async def bus(self) -> RecordingBus:
        return self.recorded


def _running_watcher() -> JobWatcher:
    watcher = JobWatcher(bus=None, job="demo", total_steps=400)  # type: ignore[arg-type]
    watcher.last_status = schemas.JobStatus(
        job="demo", ts=0, state="running", attempt=2, world_size=2, procs_per_node=1
    )
    watcher.attempt, watcher.step = 2, 140
    watcher.last_step_at = time.monotonic()
    return watcher


def _straggler_signal(node: str) -> schemas.Signal:
    return schemas.Signal(
        job="demo", ts=time.time_ns(), signal="straggler", node=node, rank=1, detail="slow"
    )


async def test_the_next_fault_waits_until_the_straggler_is_flagged() -> None:
    watcher, ctx = _running_watcher(), SlowingContext()
    driver = Driver(ctx=ctx, watcher=watcher, scenario=SCENARIOS["full"], steps=400)  # type: ignore[arg-type]
    settled = await driver._inject(STRAGGLER)
    await asyncio.sleep(0.3)
    assert [c.factor for c in ctx.recorded.commands] == [STRAGGLER.factor]  # slowed
    # past the next fault's step and stepping, but unjudged: the next fault must wait
    watcher.step, watcher.last_step_at = 260, time.monotonic()
    assert not settled()
    watcher.signals.append(_straggler_signal("node-0"))  # another node's flag is no verdict
    await asyncio.sleep(0.3)
    watcher.last_step_at = time.monotonic()
    assert not settled()
    watcher.signals.append(_straggler_signal("node-1"))
    await asyncio.sleep(0.3)
    assert not settled()  # flagged; the job has not stepped since
    watcher.last_step_at = time.monotonic()
    assert settled()
    for task in list(driver._background):
        task.cancel()
    await asyncio.gather(*driver._background, return_exceptions=True)
    assert ctx.recorded.commands[-1].clear  # the rank's pace is set back


async def test_a_straggler_never_flagged_releases_the_next_fault_when_it_ends() -> None:
    watcher, ctx = _running_watcher(), SlowingContext()
    brief = DemoFault(
        0.34, "slow-rank", rank=1, duration_s=0.2, min_slow_steps=1, unflagged_cap_s=0.5
    )
    driver = Driver(ctx=ctx, watcher=watcher, scenario=SCENARIOS["full"], steps=400)  # type: ignore[arg-type]
    settled = await driver._inject(brief)
    await asyncio.sleep(0.2)
    watcher.step += 5
    watcher.last_step_at = time.monotonic()
    assert not settled()  # still within its cap
    await asyncio.wait_for(asyncio.gather(*driver._background), 5)
    watcher.last_step_at = time.monotonic()
    assert settled()
    assert "not flagged" in driver.injected[-1].detail
