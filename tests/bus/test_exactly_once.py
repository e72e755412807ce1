"""Exactly once through a real nats-server taken away around a command's completion record,
and through an executor process killed between executing a command and recording it.

A restart executed twice kills the healthy attempt the first one started. The executor is
``FileJob`` (:mod:`tests.bus.executor_process`), a fake job whose attempt each restart
advances, as the actuator's backend does; its fence is that attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from nats.js.api import ConsumerConfig, DeliverPolicy

from goodput import schemas, subjects
from goodput.bus import Bus, BusSettings, CommandRunner, DoneLog, EmbeddedNats
from tests.bus.executor_process import ACK_WAIT_S, TARGET, FileJob, runner
from tests.bus.partition import PartitionRelay
from tests.bus.samples import JOB
from tests.processes import kill

ROOT = Path(__file__).resolve().parents[2]


async def _until(condition, what: str, timeout_s: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"never happened within {timeout_s} s: {what}")
        await asyncio.sleep(0.05)


async def _recorded(bus: Bus, command_id: str) -> schemas.ActionResult:
    for _ in range(600):
        with contextlib.suppress(Exception):
            result = await DoneLog(bus, JOB, TARGET).result(command_id)
            if result is not None:
                return result
        await asyncio.sleep(0.1)
    raise AssertionError("no completion record")


async def _published_results(bus: Bus) -> list[str]:
    """The command ids of the ActionResults in the events stream, in order."""
    subscription = await bus.js.pull_subscribe(
        subjects.event(JOB, schemas.kind_of(schemas.ActionResult)),
        stream=subjects.EVENTS_STREAM,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
    )
    ids = []
    with contextlib.suppress(Exception):
        for message in await subscription.fetch(10, timeout=2):
            ids.append(schemas.decode_event(message.data).command_id)
    await subscription.unsubscribe()
    return ids


async def _stop(task: asyncio.Task[None], command_runner: CommandRunner) -> None:
    command_runner.stop()
    try:
        await asyncio.wait_for(task, 10)
    except TimeoutError:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _executor_process(url: str, job: FileJob, when: str = "") -> subprocess.Popen[bytes]:
    """An executor in its own process, killed by the test like a crashed actuator."""
    args = [str(job.path), str(job.hold) if job.hold else "", *([when] if when else [])]
    return subprocess.Popen(
        [sys.executable, "-m", "tests.bus.executor_process", url, *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )


@pytest.mark.parametrize(
    ("how", "outage_s"),
    [("stop", 0.0), ("stop", 3.0), ("kill", 10.0)],
    ids=["stopped-0s", "stopped-3s", "killed-10s"],
)
async def test_an_outage_at_the_completion_record_executes_the_command_once(
    nats_server: EmbeddedNats, bus: Bus, tmp_path: Path, how: str, outage_s: float
) -> None:
    job = FileJob(tmp_path / "job.json", hold=tmp_path / "hold")
    command_runner = runner(bus, job)
    task = asyncio.create_task(command_runner.run())
    restart = schemas.Restart(job=JOB, reason="test")
    await bus.send_command(TARGET, restart)
    await _until(lambda: job.attempt == 1, "the restart took effect")
    # the server goes after the restart, before its completion is recorded
    await asyncio.to_thread(nats_server.stop if how == "stop" else nats_server.kill)
    job.hold.touch()
    await asyncio.sleep(outage_s)
    await asyncio.to_thread(nats_server.start)
    result = await _recorded(bus, restart.command_id)
    assert result.ok and result.detail == "restarted (attempt 1)" and not result.duplicate
    # several ack deadlines later: a command left un-acked would have been redelivered by now
    await asyncio.sleep(4 * ACK_WAIT_S)
    after = schemas.Restart(job=JOB, reason="after the outage")
    await bus.send_command(TARGET, after)
    await _until(lambda: job.attempt == 2, "the next command executed")
    await _stop(task, command_runner)
    assert job.executed == [restart.command_id, after.command_id]
    # a server back after the ack deadline passed may redeliver the command before the
    # in-progress acks reach it again: that delivery is recognised, never executed
    assert command_runner.duplicates <= 1 and command_runner.not_repeated == 0
    assert await _published_results(bus) == [restart.command_id, after.command_id]


@pytest.mark.parametrize("partition_s", [1.0, 6.0, 10.0])
async def test_a_partition_at_the_completion_record_executes_the_command_once(
    nats_server: EmbeddedNats, bus: Bus, tmp_path: Path, partition_s: float
) -> None:
    """The probe's case: the record's request is lost (not delayed) and times out; once
    that was the end of it, and the command ran again on its redelivery."""
    relay = PartitionRelay(nats_server.port)
    await relay.start()
    executor_bus = await Bus.connect(BusSettings(url=relay.url), name="executor")
    job = FileJob(tmp_path / "job.json", hold=tmp_path / "hold")
    command_runner = runner(executor_bus, job)
    task = asyncio.create_task(command_runner.run())
    try:
        restart = schemas.Restart(job=JOB, reason="test")
        await bus.send_command(TARGET, restart)
        await _until(lambda: job.attempt == 1, "the restart took effect")
        relay.partition()
        job.hold.touch()
        await asyncio.sleep(partition_s)
        relay.heal()
        result = await _recorded(bus, restart.command_id)
        assert result.ok and result.detail == "restarted (attempt 1)"
        await asyncio.sleep(4 * ACK_WAIT_S)  # any redelivery has come by now
        await _stop(task, command_runner)
    finally:
        await executor_bus.close()
        await relay.close()
    assert job.executed == [restart.command_id] and job.attempt == 1
    assert await _published_results(bus) == [restart.command_id]


async def test_a_restart_begun_by_an_executor_killed_unrecorded_is_not_run_again(
    nats_server: EmbeddedNats, bus: Bus, tmp_path: Path
) -> None:
    """The executor process is killed while the bus is away after its restart: its
    successor finds the claim, sees the attempt has moved on and does not restart again."""
    job = FileJob(tmp_path / "job.json", hold=tmp_path / "hold")
    process = _executor_process(nats_server.url, job)
    try:
        restart = schemas.Restart(job=JOB, reason="test")
        await bus.send_command(TARGET, restart)
        await _until(lambda: job.attempt == 1, "the restart took effect")
        await asyncio.to_thread(nats_server.stop)
        job.hold.touch()
        await asyncio.sleep(1.0)  # its completion record is being retried
    finally:
        kill(process)
    await asyncio.to_thread(nats_server.start)
    assert await DoneLog(bus, JOB, TARGET).result(restart.command_id) is None
    successor = runner(bus, job)
    task = asyncio.create_task(successor.run())
    result = await _recorded(bus, restart.command_id)
    await _stop(task, successor)
    assert job.executed == [restart.command_id] and job.attempt == 1
    assert successor.not_repeated == 1 and successor.executed == 0
    assert not result.ok and result.duplicate
    assert "'attempt 0' -> 'attempt 1'" in result.detail and "not run again" in result.detail
    assert await _published_results(bus) == [restart.command_id]


async def test_a_command_claimed_by_an_executor_killed_before_acting_is_run_once(
    nats_server: EmbeddedNats, bus: Bus, tmp_path: Path
) -> None:
    """The executor process is killed after its claim, before the restart took effect (the
    attempt is unchanged): its successor runs the command, once."""
    job = FileJob(tmp_path / "job.json", hold=tmp_path / "hold")
    process = _executor_process(nats_server.url, job, when="before")
    done = DoneLog(bus, JOB, TARGET)
    restart = schemas.Restart(job=JOB, reason="test")
    claimed: list[schemas.CommandClaim] = []
    try:
        await bus.send_command(TARGET, restart)
        while not claimed:
            claim = await done.claim(restart.command_id)
            claimed += [claim] if claim is not None else []
            await asyncio.sleep(0.05)
    finally:
        kill(process)
    assert claimed[0].fence == "attempt 0" and job.attempt == 0
    job.hold.touch()
    successor = runner(bus, job)
    task = asyncio.create_task(successor.run())
    result = await _recorded(bus, restart.command_id)
    await _stop(task, successor)
    assert job.executed == [restart.command_id] and job.attempt == 1
    assert result.ok and not result.duplicate and successor.not_repeated == 0
