"""``request``: the actuator's one way to ask another part over the bus and wait for its
answer (a node's checkpoint restore, a GPU reset, an agent's launch), against a real
nats-server and a real CommandRunner as the executor."""

from __future__ import annotations

import asyncio
import contextlib
import time

from goodput import schemas, subjects
from goodput.bus import Bus, CommandRunner
from goodput.bus.commands import request
from tests.bus.samples import JOB

TARGET = subjects.node_target(subjects.REPLICATOR, "node-0")


async def _answering(bus: Bus, seen: list[str]) -> tuple[CommandRunner, asyncio.Task[None]]:
    async def execute(command: schemas.Command) -> tuple[bool, str]:
        seen.append(command.command_id)
        return command.node == "node-0", f"filled {command.node}"  # type: ignore[attr-defined]

    runner = CommandRunner(bus, job=JOB, target=TARGET, service="replicator", execute=execute)
    return runner, asyncio.create_task(runner.run())


async def _stop(runner: CommandRunner, task: asyncio.Task[None]) -> None:
    runner.stop()
    with contextlib.suppress(asyncio.CancelledError, TimeoutError):
        await asyncio.wait_for(task, 10)


async def test_the_executors_recorded_result_is_the_answer(bus: Bus) -> None:
    seen: list[str] = []
    runner, task = await _answering(bus, seen)
    try:
        command = schemas.RestoreToNode(job=JOB, node="node-0", reason="before launch")
        result = await request(bus, TARGET, command, timeout_s=30)
        assert result is not None and result.ok and result.detail == "filled node-0"
        assert result.command_id == command.command_id and seen == [command.command_id]
        # a refusal is an answer too, not a timeout
        other = schemas.RestoreToNode(job=JOB, node="node-9", reason="before launch")
        refused = await request(bus, TARGET, other, timeout_s=30)
        assert refused is not None and not refused.ok
    finally:
        await _stop(runner, task)


async def test_no_executor_is_no_answer_at_the_deadline_or_once_abandoned(bus: Bus) -> None:
    command = schemas.RestoreToNode(job=JOB, node="node-0", reason="before launch")
    started = time.monotonic()
    assert await request(bus, TARGET, command, timeout_s=1.0) is None
    assert time.monotonic() - started >= 1.0
    gone = schemas.RestoreToNode(job=JOB, node="node-0", reason="before launch")
    started = time.monotonic()
    assert await request(bus, TARGET, gone, timeout_s=60, abandon=lambda: True) is None
    assert time.monotonic() - started < 30  # it did not wait out the deadline
