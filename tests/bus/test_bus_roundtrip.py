"""Every schema through a real JetStream server; dedup by message id; dead letters."""

from __future__ import annotations

import asyncio

import nats.js.errors
from nats.js.api import ConsumerConfig, DeliverPolicy

from goodput import schemas, subjects
from goodput.bus import Bus, DurableConsumer
from tests.bus.recording_runner import recording_runner
from tests.bus.samples import JOB, sample_commands, sample_events


async def _read_stream(bus: Bus, stream: str, subject: str, count: int) -> list[tuple[str, bytes]]:
    subscription = await bus.js.pull_subscribe(
        subject, stream=stream, config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL)
    )
    messages = await subscription.fetch(count, timeout=5)
    return [(m.subject, m.data) for m in messages]


async def test_every_event_round_trips_through_jetstream(bus: Bus) -> None:
    events = sample_events()
    for event in events:
        await bus.emit(event)
    stored = await _read_stream(bus, subjects.EVENTS_STREAM, subjects.events_of(JOB), len(events))
    assert [schemas.decode_event(data) for _, data in stored] == events
    assert [subject for subject, _ in stored] == [subjects.event_for(e) for e in events]


async def test_every_command_round_trips_through_jetstream(bus: Bus) -> None:
    commands = sample_commands()
    for command in commands:
        await bus.send_command(subjects.ACTUATOR, command)
    stored = await _read_stream(
        bus, subjects.COMMANDS_STREAM, subjects.command(JOB, subjects.ACTUATOR), len(commands)
    )
    assert [schemas.decode_command(data) for _, data in stored] == commands


async def test_resending_a_command_stores_it_once(bus: Bus) -> None:
    command = schemas.CheckpointNow(job=JOB)
    first = await bus.send_command(subjects.TRAINER, command)
    second = await bus.send_command(subjects.TRAINER, command)
    assert second.duplicate and not first.duplicate
    info = await bus.js.stream_info(subjects.COMMANDS_STREAM)
    assert info.state.messages == 1


async def test_provisioning_is_idempotent(bus: Bus) -> None:
    await bus.emit(sample_events()[0])
    await bus.provision()
    await bus.provision()
    info = await bus.js.stream_info(subjects.EVENTS_STREAM)
    assert info.state.messages == 1


async def test_undecodable_input_is_dead_lettered_and_consumption_goes_on(bus: Bus) -> None:
    executed: list[str] = []
    runner = recording_runner(bus, JOB, executed)
    task = asyncio.create_task(runner.run())
    subject = subjects.command(JOB, "sensor")
    await bus.js.publish(subject, b"\xff not msgpack")
    await bus.js.publish(subject, schemas.encode(schemas.Signal(job=JOB, signal="crash")))
    good = schemas.SetThresholds(job=JOB, values={"x": 1.0})
    await bus.send_command("sensor", good)
    for _ in range(100):
        if executed and runner.consumer.dead_lettered == 2:
            break
        await asyncio.sleep(0.05)
    runner.stop()
    await task
    assert executed == [good.command_id]
    letters = await _read_stream(bus, subjects.DEAD_LETTER_STREAM, f"gp.{JOB}.dlq.>", 2)
    decoded = [schemas.decode_event(data) for _, data in letters]
    assert all(isinstance(d, schemas.DeadLetter) for d in decoded)
    assert decoded[0].payload == b"\xff not msgpack"
    assert "undecodable" in decoded[0].reason
    assert "kind" in decoded[1].reason  # an event is not a command


async def test_a_failing_handler_is_retried_then_dead_lettered(bus: Bus) -> None:
    attempts = 0

    async def always_fails(event: schemas.Event, msg: object) -> None:
        nonlocal attempts
        attempts += 1
        raise RuntimeError("boom")

    consumer = DurableConsumer(
        bus,
        stream=subjects.EVENTS_STREAM,
        durable="failing",
        subject=subjects.events_of(JOB),
        decode=schemas.decode_event,
        handler=always_fails,
        service="test",
        job=JOB,
        max_deliver=3,
    )
    task = asyncio.create_task(consumer.run())
    await bus.emit(sample_events()[0])
    for _ in range(200):
        if consumer.dead_lettered:
            break
        await asyncio.sleep(0.05)
    consumer.stop()
    await task
    assert attempts == 3
    assert consumer.dead_lettered == 1


async def test_done_log_survives_a_new_runner(bus: Bus) -> None:
    """A restarted executor does not run again what its predecessor already ran."""
    runs: list[str] = []
    command = schemas.CheckpointNow(job=JOB)
    runner = recording_runner(bus, JOB, runs, "t")
    await runner._handle(command, None)  # type: ignore[arg-type]
    again = recording_runner(bus, JOB, runs, "t")
    await again._handle(command, None)  # type: ignore[arg-type]
    assert runs == [command.command_id]
    assert again.duplicates == 1
    kv = await bus.kv(subjects.DONE_BUCKET)
    try:
        entry = await kv.get(subjects.kv_key(JOB, "t", command.command_id))
    except nats.js.errors.KeyNotFoundError as exc:
        raise AssertionError("no done record") from exc
    assert schemas.decode_event(entry.value).ok


async def test_a_close_that_finds_the_connection_lost_is_quiet(bus: Bus, monkeypatch) -> None:
    """The server went first (a cancelled Slurm allocation): closing raises nothing, so a
    process that ends then ends without a traceback."""
    real_close = bus.nc.close

    async def lost() -> None:
        await real_close()
        raise ConnectionResetError("Connection lost")

    monkeypatch.setattr(bus.nc, "close", lost)
    await bus.close()
    assert bus.nc.is_closed
