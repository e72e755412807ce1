"""The shim's bus link against a real nats-server: what a rank says as it leaves."""

from __future__ import annotations

import asyncio

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
