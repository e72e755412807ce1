"""Byte limits on a real nats-server: a full event stream crowds out no command, provisioning
converges limits, a server too small says so, a report whose run rolled off says so."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path

import nats.js.errors
import pytest
from nats.js.api import DiscardPolicy

from goodput import schemas, subjects
from goodput.bus import Bus, BusSettings, DoneLog, EmbeddedNats
from goodput.bus.client import StoreTooSmallError
from goodput.bus.job_events import HistoryRolledOffError
from goodput.bus.store_sizing import DEFAULT_SCALE, SCALE_ENV, StoreScale, store_limits
from goodput.bus.stores import stream_configs
from goodput.measure.accounting import replay_from_bus
from goodput.state_dir import StateDir
from tests.bus.recording_runner import recording_runner
from tests.conftest import goodput_cli, refused_in_one_line

JOB = "bounded"
#: every limit at its floor: events 64 MiB, commands 64 MiB, the server ~475 MiB
TINY = StoreScale(nodes=1, ranks_per_node=1, keep_h=1.0)
LARGER = StoreScale(nodes=4, ranks_per_node=8, keep_h=48.0)
#: a 60 KB event fills the stream in about a thousand publications
DETAIL = "x" * 60_000


async def _limits_on_server(bus: Bus) -> dict[str, int]:
    names = [s.name for s in stream_configs(store_limits(DEFAULT_SCALE))]
    names += [f"KV_{bucket}" for bucket in store_limits(DEFAULT_SCALE).buckets]
    return {name: (await bus.js.stream_info(name)).config.max_bytes for name in names}


def _expected(scale: StoreScale) -> dict[str, int]:
    limits = store_limits(scale)
    return {**limits.streams, **{f"KV_{name}": size for name, size in limits.buckets.items()}}


async def _until(condition, what: str) -> None:
    for _ in range(600):  # a bound on waiting, not a speed requirement
        if await condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting until {what}")


async def test_a_full_event_stream_leaves_commands_their_room(tmp_path: Path) -> None:
    """The event stream filled past its limit (oldest discarded, events still stored) while a
    command is sent, resent and executed: it runs once, on a server sized to the sum."""
    limits = store_limits(TINY)
    events_max = limits.streams[subjects.EVENTS_STREAM]
    with EmbeddedNats(StateDir(tmp_path / "nats"), store_bytes=limits.server_bytes) as server:
        bus = await Bus.connect(BusSettings(url=server.url), name="test")
        try:
            assert await bus.provision(scale=TINY) == limits
            big = schemas.Signal(job=JOB, signal="straggler", detail=DETAIL)
            await bus.emit_many([big] * (events_max // len(DETAIL)))
            info = await bus.js.stream_info(subjects.EVENTS_STREAM)
            assert events_max - 2 * len(DETAIL) < info.state.bytes <= events_max

            executed: list[str] = []
            runner = recording_runner(bus, JOB, executed)
            task = asyncio.create_task(runner.run())
            # telemetry keeps pouring in, past the limit, while the command travels
            flood = asyncio.create_task(bus.emit_many([big] * 400))
            command = schemas.SetThresholds(job=JOB, values={"x": 1.0})
            first = await bus.send_command(subjects.SENSOR, command)
            again = await bus.send_command(subjects.SENSOR, command)
            assert again.duplicate and not first.duplicate
            done = DoneLog(bus, JOB, "sensor")
            await _until(lambda: done.is_done(command.command_id), "the command's result is stored")
            assert await flood == 400
            runner.stop()
            await task
            assert executed == [command.command_id]
            result = await done.result(command.command_id)
            assert result is not None and result.ok

            info = await bus.js.stream_info(subjects.EVENTS_STREAM)
            assert info.state.first_seq > 1  # the oldest events rolled off
            assert info.state.bytes <= events_max
            commands = await bus.js.stream_info(subjects.COMMANDS_STREAM)
            assert commands.state.messages == 1 and commands.state.first_seq == 1
        finally:
            await bus.close()


async def test_reprovisioning_converges_every_limit(
    bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SCALE_ENV, raising=False)
    await bus.emit(schemas.Signal(job=JOB, signal="straggler"))
    await bus.provision(scale=LARGER)
    assert await _limits_on_server(bus) == _expected(LARGER)
    await bus.provision(scale=TINY)
    assert await _limits_on_server(bus) == _expected(TINY)
    # a process told no scale keeps the limits a sizing process set
    await bus.provision()
    assert await _limits_on_server(bus) == _expected(TINY)
    # the environment's scale is a scale told
    monkeypatch.setenv(SCALE_ENV, "nodes=4,ranks_per_node=8,keep_h=48")
    await bus.provision()
    assert await _limits_on_server(bus) == _expected(LARGER)
    # nothing stored was lost on the way
    info = await bus.js.stream_info(subjects.EVENTS_STREAM)
    assert info.state.messages == 1


async def test_a_stream_of_an_older_release_gets_a_limit(
    bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(SCALE_ENV, raising=False)
    config = next(s for s in stream_configs(store_limits(DEFAULT_SCALE)))
    await bus.js.update_stream(dataclasses.replace(config, max_bytes=-1))
    assert (await bus.js.stream_info(config.name)).config.max_bytes == -1
    await bus.provision()
    assert (await bus.js.stream_info(config.name)).config.max_bytes == config.max_bytes


def _store_full() -> nats.js.errors.APIError:
    return nats.js.errors.APIError(
        code=500, err_code=10047, description="insufficient storage resources available"
    )


async def test_a_stream_and_a_bucket_added_by_another_process_at_once_are_kept(
    bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two services provisioning at the same moment (two controllers): the server weighs the
    second add beside the first's reservation and refuses it for storage, while the stream
    (or bucket) is there. Seen once as a controller failing at start (ci32)."""
    monkeypatch.delenv(SCALE_ENV, raising=False)
    stream = next(s for s in stream_configs(store_limits(DEFAULT_SCALE)))
    await bus.js.delete_stream(stream.name)
    await bus.js.delete_key_value(subjects.SERVICES_BUCKET)
    real_add, real_create = bus.js.add_stream, bus.js.create_key_value

    async def added_by_both(config=None, **options):
        await real_add(config, **options)  # the other process's add
        raise _store_full()

    async def created_by_both(config=None, **options):
        await real_create(config, **options)
        raise _store_full()

    monkeypatch.setattr(bus.js, "add_stream", added_by_both)
    monkeypatch.setattr(bus.js, "create_key_value", created_by_both)
    await bus.provision()
    assert (await bus.js.stream_info(stream.name)).config.max_bytes == stream.max_bytes
    assert await bus.js.key_value(subjects.SERVICES_BUCKET) is not None


async def test_a_server_store_smaller_than_the_limits_is_one_clear_line(tmp_path: Path) -> None:
    """The server reserves every stream's limit: one that does not fit is refused at
    provisioning, so a full stream can never take another's room."""
    too_small = store_limits(TINY).server_bytes // 2
    with EmbeddedNats(StateDir(tmp_path / "nats"), store_bytes=too_small) as server:
        bus = await Bus.connect(BusSettings(url=server.url), name="test")
        try:
            with pytest.raises(StoreTooSmallError, match="max_file_store") as caught:
                await bus.provision(scale=TINY)
            assert "\n" not in str(caught.value)
        finally:
            await bus.close()


async def test_a_run_whose_start_rolled_off_is_not_reported(
    bus: Bus, nats_server: EmbeddedNats, caplog: pytest.LogCaptureFixture
) -> None:
    """A replay of a run whose RunStarted was discarded would count only its end: refused in
    one line; ``--all-runs`` reports what is left and says events are gone."""
    events = next(s for s in stream_configs(store_limits(DEFAULT_SCALE)))
    await bus.js.update_stream(dataclasses.replace(events, max_bytes=64 * 1024))
    start = schemas.RunStarted(job=JOB, run_id="r1", command_id="c1", nodes=1, procs_per_node=1)
    steps = [
        schemas.StepDone(job=JOB, node="n0", rank=0, step=i, step_time_s=1.0, tokens=1, loss=1.0)
        for i in range(1, 401)
    ]
    await bus.emit(start)
    await bus.emit_many(steps)
    with pytest.raises(HistoryRolledOffError, match="rolled off GP_EVENTS"):
        await replay_from_bus(bus, JOB)
    with caplog.at_level(logging.WARNING):
        kept = await replay_from_bus(bus, JOB, all_runs=True)
    assert kept and kept[-1] == steps[-1] and start not in kept
    assert any("no longer holds its first" in record.message for record in caplog.records)

    report = goodput_cli("report", "--nats-url", nats_server.url, "--job", JOB, check=False)
    refused_in_one_line(report, "rolled off GP_EVENTS", code=1)

    # a run whose start is stored is whole, and reported
    second = schemas.RunStarted(job=JOB, run_id="r2", command_id="c2", nodes=1, procs_per_node=1)
    await bus.emit(second)
    await bus.emit_many(steps[:5])
    assert await replay_from_bus(bus, JOB) == [second, *steps[:5]]


async def test_command_results_drop_their_oldest_past_the_limit(bus: Bus) -> None:
    """gp_done never refuses a result (an executor would wait on it forever); the buckets of
    a bounded key set keep JetStream's refusal."""
    done = await bus.js.stream_info(f"KV_{subjects.DONE_BUCKET}")
    assert done.config.discard == DiscardPolicy.OLD
    services = await bus.js.stream_info(f"KV_{subjects.SERVICES_BUCKET}")
    assert services.config.discard == DiscardPolicy.NEW
    await bus.js.update_stream(dataclasses.replace(done.config, max_bytes=64 * 1024))
    kv = await bus.kv(subjects.DONE_BUCKET)
    for i in range(200):
        await kv.put(subjects.kv_key(JOB, "sensor", f"c{i}"), b"r" * 1024)
    assert (await kv.get(subjects.kv_key(JOB, "sensor", "c199"))).value == b"r" * 1024
    with pytest.raises(nats.js.errors.KeyNotFoundError):
        await kv.get(subjects.kv_key(JOB, "sensor", "c0"))


def test_the_embedded_store_is_sized_for_the_scale_of_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What `goodput up --store-scale` sets for the server it starts and every service."""
    monkeypatch.setenv(SCALE_ENV, "nodes=64,keep_h=6")
    server = EmbeddedNats(StateDir(tmp_path))
    assert server.store_bytes == store_limits(StoreScale(nodes=64, keep_h=6.0)).server_bytes
    monkeypatch.delenv(SCALE_ENV)
    assert EmbeddedNats(StateDir(tmp_path)).store_bytes == store_limits(DEFAULT_SCALE).server_bytes
    refused = goodput_cli(
        "up", "--state-dir", str(tmp_path), "--store-scale", "nodes=0", check=False
    )
    assert refused.returncode == 2
    assert "--store-scale='nodes=0': store scale nodes must be at least 1" in refused.stderr
