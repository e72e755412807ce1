"""Dead letters never outgrow the server's limit, and failing to store one never stops a consumer."""

from __future__ import annotations

import asyncio
import dataclasses

import msgspec
import pytest
from nats.js.api import ConsumerConfig, DeliverPolicy

from goodput import schemas, subjects
from goodput.bus import Bus, DurableConsumer
from goodput.bus.store_sizing import DEFAULT_SCALE, store_limits
from goodput.bus.stores import stream_configs
from tests.bus.recording_runner import recording_runner
from tests.bus.samples import JOB


async def _letters(bus: Bus, count: int) -> list[tuple[bytes, schemas.DeadLetter]]:
    subscription = await bus.js.pull_subscribe(
        f"gp.{JOB}.dlq.>",
        stream=subjects.DEAD_LETTER_STREAM,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
    )
    messages = await subscription.fetch(count, timeout=5)
    await subscription.unsubscribe()
    return [(m.data, schemas.decode_event(m.data)) for m in messages]  # type: ignore[misc]


async def _until(condition, what: str) -> None:
    for _ in range(400):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"never happened: {what}")


async def _consume(bus: Bus, published: list[tuple[str, bytes]], good: schemas.Event):
    """Publish ``published`` then ``good`` into GP_EVENTS; what the handler was given once
    ``good`` was, and the consumer."""
    handled: list[schemas.Event] = []

    async def handler(event: schemas.Event, msg: object) -> None:
        handled.append(event)

    consumer = DurableConsumer(
        bus,
        stream=subjects.EVENTS_STREAM,
        durable="probe",
        subject=subjects.events_of(JOB),
        decode=schemas.decode_event,
        handler=handler,
        service="test",
        job=JOB,
    )
    task = asyncio.create_task(consumer.run())
    for subject, payload in published:
        await bus.js.publish(subject, payload)
    await bus.emit(good)
    await _until(lambda: handled, "the good event handled")
    consumer.stop()
    await task
    return handled, consumer


async def test_the_dead_letter_of_a_max_size_message_fits_in_max_payload(bus: Bus) -> None:
    executed: list[str] = []
    runner = recording_runner(bus, JOB, executed)
    task = asyncio.create_task(runner.run())
    limit = bus.nc.max_payload
    huge = bytes(range(256)) * (limit // 256)
    assert len(huge) == limit
    stored = await bus.js.publish(subjects.command(JOB, "sensor"), huge)
    good = schemas.SetThresholds(job=JOB, values={"x": 1.0})
    await bus.send_command("sensor", good)
    await _until(lambda: executed, "the command after the huge one executed")
    runner.stop()
    await task
    [(raw, letter)] = await _letters(bus, 1)
    assert len(raw) <= limit
    assert letter.size == limit and letter.stream_seq == stored.seq
    assert 0 < len(letter.payload) < limit and huge.startswith(letter.payload)
    assert letter.reason.startswith("undecodable")
    assert executed == [good.command_id]


@pytest.mark.parametrize("reason_chars", [0, 2000, 10_000])
def test_a_dead_letter_entry_is_cut_to_the_limit_whatever_the_reason(reason_chars: int) -> None:
    from goodput.bus.dead_letters import DEAD_LETTER_HEADROOM, dead_letter_entry

    letter = dead_letter_entry(
        job=JOB,
        service="sensor",
        subject="gp.job-a.evt.x",
        reason="é" * reason_chars,
        payload=b"\x01" * (1 << 20),
        stream_seq=7,
        max_payload=1 << 20,
    )
    assert len(schemas.encode(letter)) <= (1 << 20) - DEAD_LETTER_HEADROOM
    assert letter.size == 1 << 20 and letter.stream_seq == 7


async def test_a_letter_that_cannot_be_stored_does_not_stop_the_consumer(bus: Bus) -> None:
    """GP_DLQ refusing every letter (max_msg_size) is logged; the next command still runs."""
    config = next(
        s
        for s in stream_configs(store_limits(DEFAULT_SCALE))
        if s.name == subjects.DEAD_LETTER_STREAM
    )
    await bus.js.update_stream(dataclasses.replace(config, max_msg_size=64))
    executed: list[str] = []
    runner = recording_runner(bus, JOB, executed)
    task = asyncio.create_task(runner.run())
    await bus.js.publish(subjects.command(JOB, "sensor"), b"\xff" * 500)
    good = schemas.SetThresholds(job=JOB, values={"x": 1.0})
    await bus.send_command("sensor", good)
    await _until(lambda: executed, "the command after the undeliverable one executed")
    runner.stop()
    await task
    assert runner.consumer.undeliverable == 1 and runner.consumer.dead_lettered == 0
    # both messages acked: an ack is a publish the server applies to the consumer on its own
    # time, so a consumer_info sent right after it may still count it pending (seen in CI)
    for _ in range(200):  # a bound on waiting, not a speed requirement
        info = await bus.js.consumer_info(subjects.COMMANDS_STREAM, f"{JOB}-sensor")
        if info.num_ack_pending == 0 and info.num_pending == 0:
            break
        await asyncio.sleep(0.05)
    assert (info.num_ack_pending, info.num_pending, info.num_redelivered) == (0, 0, 0)


async def test_deeply_nested_input_is_dead_lettered_not_fatal(bus: Bus) -> None:
    nested = b"\x82" + msgspec.msgpack.encode("job") + b"\x91" * 20_000 + b"\xc0"
    with pytest.raises(schemas.SchemaError, match="nested too deeply"):
        schemas.decode_event(nested + msgspec.msgpack.encode("kind") + b"\xa1x")
    published = [(subjects.event(JOB, "step_done"), nested)]
    _, consumer = await _consume(bus, published, schemas.Signal(job=JOB, signal="crash"))
    assert consumer.dead_lettered == 1


async def test_a_command_id_that_cannot_be_recorded_is_dead_lettered_at_once(bus: Bus) -> None:
    executed: list[str] = []
    runner = recording_runner(bus, JOB, executed)
    task = asyncio.create_task(runner.run())
    bad = schemas.SetThresholds(job=JOB, values={"x": 1.0}, command_id="a b*")
    await bus.js.publish(subjects.command(JOB, "sensor"), schemas.encode(bad))
    good = schemas.SetThresholds(job=JOB, values={"x": 2.0})
    await bus.send_command("sensor", good)
    await _until(lambda: executed, "the good command executed")
    runner.stop()
    await task
    assert executed == [good.command_id] and runner.consumer.dead_lettered == 1
    [(_, letter)] = await _letters(bus, 1)
    assert "command_id" in letter.reason
