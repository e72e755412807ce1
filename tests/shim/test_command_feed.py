"""Trainer commands reach a rank without a JetStream consumer (issue 36), on a real
nats-server: a core subscription, the newest stored command looked up on (re)subscribing."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from goodput import schemas, subjects
from goodput.bus import Bus, BusSettings, EmbeddedNats
from goodput.shim.command_feed import CommandFeed, RecentIds, stored_ns
from goodput.shim.link import BusLink


def interval(ts: int, every_steps: int) -> schemas.SetCheckpointInterval:
    return schemas.SetCheckpointInterval(job="j", ts=ts, every_steps=every_steps)


def link(bus: Bus, received: list[schemas.Command], since_ns: int | None = None) -> BusLink:
    return BusLink(
        settings=bus.settings,
        job="j",
        node="node-0",
        rank=0,
        heartbeat_period_s=0.5,
        on_command=received.append,
        commands_since_ns=since_ns,
    )


async def until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Wait for ``condition`` (a bound on waiting, not a speed requirement)."""
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.02)


async def trainer_consumers(bus: Bus) -> int:
    return (await bus.js.stream_info(subjects.COMMANDS_STREAM)).state.consumer_count


async def test_sent_before_the_subscription_by_the_lookup_then_live_each_once(bus: Bus) -> None:
    before_launch = interval(1, 5)
    await bus.send_command(subjects.TRAINER, before_launch)
    launched_ns = schemas.now_ns()
    early = interval(2, 7)
    await bus.send_command(subjects.TRAINER, early)
    received: list[schemas.Command] = []
    rank = link(bus, received, launched_ns)
    try:
        assert await asyncio.to_thread(rank.connected.wait, 30)
        await until(lambda: len(received) == 1)
        assert received == [early]  # by the lookup; the one from before the launch is not
        live = interval(3, 9)
        await bus.send_command(subjects.TRAINER, live)
        await bus.send_command(subjects.TRAINER, live)  # a re-send: the same id, seen again
        await until(lambda: len(received) == 2)
        await bus.nc.flush()
        await asyncio.sleep(0.3)  # the re-send, delivered live too, would be here by now
        assert received == [early, live]
        assert await trainer_consumers(bus) == 0
    finally:
        await asyncio.to_thread(rank.close)


async def test_no_command_from_before_the_launch(bus: Bus) -> None:
    await bus.send_command(subjects.TRAINER, interval(1, 5))
    received: list[schemas.Command] = []
    rank = link(bus, received, schemas.now_ns())
    try:
        assert await asyncio.to_thread(rank.connected.wait, 30)
        await asyncio.sleep(1.0)  # the lookup has answered by now (nothing to wait on)
        assert received == []
        assert await trainer_consumers(bus) == 0
    finally:
        await asyncio.to_thread(rank.close)


async def test_a_command_sent_while_the_server_was_away_arrives_on_reconnect(
    nats_server: EmbeddedNats,
) -> None:
    """The server restarts; the command stored right after it is back, before the rank's
    client reconnected, is read by the lookup on reconnect; only the newest of the gap."""
    rank_bus = await Bus.connect(BusSettings(url=nats_server.url), name="rank")
    sender = await Bus.connect(BusSettings(url=nats_server.url), name="sender")
    await sender.provision()
    received: list[schemas.Command] = []

    async def reject(subject: str, reason: str, payload: bytes) -> None:
        raise AssertionError(f"rejected {subject}: {reason}")

    feed = CommandFeed(
        rank_bus, job="j", since_ns=schemas.now_ns(), on_command=received.append, reject=reject
    )
    try:
        await feed.start()
        first = interval(1, 5)
        await sender.send_command(subjects.TRAINER, first)
        await until(lambda: received == [first])
        reconnected = asyncio.Event()
        rank_bus.on_reconnect(reconnected.set)
        # the rank's client is paused in its reconnect wait while the sender stores two
        rank_bus.nc.options["reconnect_time_wait"] = 8.0
        nats_server.stop()
        nats_server.start()
        missed, newest = interval(2, 7), interval(3, 9)
        await sender.send_command(subjects.TRAINER, missed, retry_for_s=30)
        await sender.send_command(subjects.TRAINER, newest, retry_for_s=30)
        assert not reconnected.is_set(), "the rank reconnected before the gap was over"
        await asyncio.wait_for(reconnected.wait(), 30)
        await until(lambda: len(received) == 2)
        await asyncio.sleep(0.3)
        assert received == [first, newest]  # newest wins across a gap
        assert await trainer_consumers(sender) == 0
    finally:
        await feed.stop()
        await rank_bus.close()
        await sender.close()


def test_the_memory_of_ids_is_bounded() -> None:
    seen = RecentIds(capacity=2)
    assert seen.first_time("a") and seen.first_time("b")
    assert not seen.first_time("a")
    assert seen.first_time("c")  # "a" falls out
    assert seen.first_time("a")


def test_a_stored_time_keeps_its_nanoseconds() -> None:
    assert stored_ns("1970-01-01T00:00:01.000000007Z") == 1_000_000_007
    assert stored_ns("2026-11-29T07:00:00Z") == 1_795_935_600 * 10**9
    assert stored_ns("1970-01-01T00:00:00.5Z") == 500_000_000
