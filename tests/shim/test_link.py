"""The shim's bus link against a real nats-server: what a rank says as it leaves."""

from __future__ import annotations

import asyncio
import sys

from goodput import schemas, subjects
from goodput.bus import Bus
from goodput.shim.link import BusLink
from tests.processes import kill_async


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
        await kill_async(process)


async def test_a_command_for_another_job_on_the_trainers_subject_is_dead_lettered(
    bus: Bus,
) -> None:
    """Issue 41: a trainer acted on a command naming another job than its subject's."""
    commands: list[schemas.Command] = []
    link = BusLink(
        settings=bus.settings,
        job="j",
        node="node-0",
        rank=0,
        heartbeat_period_s=1.0,
        on_command=commands.append,
    )
    assert await asyncio.to_thread(link.connected.wait, 30)
    try:
        forged = schemas.CheckpointNow(job="other")
        await bus.js.publish(subjects.command("j", subjects.TRAINER), schemas.encode(forged))
        good = schemas.CheckpointNow(job="j")
        await bus.send_command(subjects.TRAINER, good)
        for _ in range(600):  # a bound on waiting, not a speed requirement
            if commands:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)  # the forged one, delivered first, would be here by now
        assert commands == [good]
        letters = await bus.js.pull_subscribe(
            subjects.dead_letter("j", "trainer-0"), stream=subjects.DEAD_LETTER_STREAM
        )
        [letter] = [schemas.decode_event(m.data) for m in await letters.fetch(1, timeout=5)]
        assert (
            letter.reason
            == "wrong subject: job 'other' is not the job of its subject gp.j.cmd.trainer"
        )
    finally:
        await asyncio.to_thread(link.close)
