"""A scenario fault whose moment never comes is recorded as failed, never skipped silently.

The demo once lost its follower on a NATS restart: the job finished while the driver still
waited for the second fault's step, and the demo reported the scenario as played.
"""

from __future__ import annotations

import asyncio

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
