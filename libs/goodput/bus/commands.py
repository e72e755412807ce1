"""Executing commands exactly once by id.

Commands are redelivered after a crash or a lost ack; the executor records each executed id in
the ``gp_done`` KV bucket before acking, and skips ids it already holds. The order is
execute → record → emit result → ack, so the only window for a repeat is a crash between
execute and record; executors keep their own actions idempotent for that (e.g. a restart
names the attempt it replaces).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Awaitable, Callable

import nats.js.errors
from nats.aio.msg import Msg

from goodput import schemas, subjects
from goodput.bus.client import Bus
from goodput.bus.consumer import DurableConsumer
from goodput.telemetry import tracer

log = logging.getLogger(__name__)

#: a command id becomes a KV key token in ``gp_done``
_COMMAND_ID = re.compile(r"^[-/_=A-Za-z0-9]{1,256}$")

#: an executor returns (ok, detail)
Executor = Callable[[schemas.Command], Awaitable[tuple[bool, str]]]


class DoneLog:
    """Which command ids an executor has already run, kept in JetStream KV."""

    def __init__(self, bus: Bus, job: str, executor: str):
        self.bus = bus
        self.job = job
        self.executor = executor

    def _key(self, command_id: str) -> str:
        return subjects.kv_key(self.job, self.executor, command_id)

    async def result(self, command_id: str) -> schemas.ActionResult | None:
        """The recorded result of an executed command, or None if it has not run."""
        kv = await self.bus.kv(subjects.DONE_BUCKET)
        try:
            entry = await kv.get(self._key(command_id))
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return None
        result = schemas.decode_event(entry.value or b"")
        return result if isinstance(result, schemas.ActionResult) else None

    async def is_done(self, command_id: str) -> bool:
        return await self.result(command_id) is not None

    async def record(self, command_id: str, result: schemas.ActionResult) -> None:
        kv = await self.bus.kv(subjects.DONE_BUCKET)
        await kv.put(self._key(command_id), schemas.encode(result))


def decode_executable_command(payload: bytes) -> schemas.Command:
    """A command whose id can be recorded in ``gp_done``; otherwise :class:`SchemaError`."""
    command = schemas.decode_command(payload)
    if not _COMMAND_ID.match(command.command_id):
        raise schemas.SchemaError(
            f"command_id {command.command_id[:64]!r} is not an id "
            "(1-256 letters, digits, '-', '_', '=', '/')"
        )
    return command


class CommandRunner:
    """A durable consumer of ``gp.<job>.cmd.<target>`` that runs each command once."""

    def __init__(self, bus: Bus, *, job: str, target: str, service: str, execute: Executor):
        self.bus = bus
        self.job = job
        self.service = service
        self.execute = execute
        self.done = DoneLog(bus, job, target)
        self.executed = 0
        self.duplicates = 0
        self._tracer = tracer(f"goodput.{service}")
        self.consumer = DurableConsumer(
            bus,
            stream=subjects.COMMANDS_STREAM,
            durable=f"{job}-{target}",
            subject=subjects.command(job, target),
            decode=decode_executable_command,
            handler=self._handle,
            service=service,
            job=job,
        )

    async def run(self) -> None:
        await self.consumer.run()

    def stop(self) -> None:
        self.consumer.stop()

    async def _handle(self, command: schemas.Command, msg: Msg) -> None:
        if await self.done.is_done(command.command_id):
            self.duplicates += 1
            log.info(
                "command already executed; not repeating it",
                extra={"command_id": command.command_id, "action": schemas.kind_of(type(command))},
            )
            return
        action = schemas.kind_of(type(command))
        # a child of the sender's span when the command came with a traceparent (a remediation)
        with self._tracer.start_as_current_span(
            f"{self.service} execute {action}",
            attributes={"goodput.job": self.job, "goodput.command_id": command.command_id},
        ) as span:
            started = time.monotonic()
            try:
                ok, detail = await self.execute(command)
            except Exception as exc:  # the executor's failure is a result, not a redelivery loop
                log.exception("command failed", extra={"command_id": command.command_id})
                ok, detail = False, f"{type(exc).__name__}: {exc}"
            span.set_attribute("goodput.ok", ok)
            result = schemas.ActionResult(
                job=self.job,
                command_id=command.command_id,
                action=action,
                ok=ok,
                detail=detail,
                duration_s=time.monotonic() - started,
            )
            await self.done.record(command.command_id, result)
            self.executed += 1
            await self.bus.emit(result)
