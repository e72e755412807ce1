"""The shim's bus link against a real nats-server: what a rank says as it leaves."""

from __future__ import annotations

import asyncio
import sys

from goodput import schemas, subjects
from goodput.bus import Bus
from goodput.shim.link import BusLink


async def test_the_last_heartbeat_says_the_rank_is_leaving(bus: Bus) -> None:
    beats: list[schemas.Heartbeat] = []

    async def on_beat(msg) -> None:
        beats.append(schemas.decode_event(msg.data))

    await bus.nc.subscribe(subjects.heartbeat("j", "node-0", 3), cb=on_beat)
    await bus.nc.flush()
    link = BusLink(
        settings=bus.settings,
        job="j",
        node="node-0",
        rank=3,
        heartbeat_period_s=0.05,
        on_command=lambda _command: None,
    )
    assert await asyncio.to_thread(link.connected.wait, 30)

    async def first_beat() -> None:
        while not beats:
            await asyncio.sleep(0.05)

    await asyncio.wait_for(first_beat(), 30)
    assert beats[0].busy == ""
    await asyncio.to_thread(link.close)
    await bus.nc.flush()
    await asyncio.sleep(0.2)
    assert beats[-1].busy == schemas.BUSY_EXITING
    assert all(beat.busy == "" for beat in beats[:-1])


async def test_a_process_that_never_closes_its_link_still_exits(bus: Bus) -> None:
    """A script that raises before the shim's finish leaves its link open: the process must
    still exit (its crash is what the supervisor acts on), not wait forever at shutdown."""
    script = (
        "import time\n"
        "from goodput.bus import BusSettings\n"
        "from goodput.shim.link import BusLink\n"
        f"settings = BusSettings(url={bus.settings.url!r})\n"
        "link = BusLink(settings=settings, job='j', node='node-0', rank=0,\n"
        "               heartbeat_period_s=0.05, on_command=lambda _command: None)\n"
        "assert link.connected.wait(60)\n"
        "from goodput import schemas\n"
        "link.publish(schemas.CheckpointSaved(job='j', node='node-0', rank=0, step=1,\n"
        "                                     stall_s=0.0, bytes=1))\n"
        "while not link._events.empty():\n"
        "    time.sleep(0.01)\n"
        "time.sleep(1)  # the event is on its way: the link waits for the next one\n"
        "raise SystemExit(3)\n"
    )
    process = await asyncio.create_subprocess_exec(sys.executable, "-c", script)
    try:
        assert await asyncio.wait_for(process.wait(), 60) == 3
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
