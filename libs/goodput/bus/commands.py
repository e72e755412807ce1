"""Executing commands exactly once by id.

Commands are redelivered after a crash or a lost ack; the executor records each executed id
in the ``gp_done`` KV bucket before acking, and skips ids it already holds. The order is
claim → execute → record → emit result → ack:

- the lookups of the record and the claim, the claim (a :class:`~goodput.schemas.CommandClaim`
  with the executor's *fence*, what its state was before it ran the command) and the record
  are each retried until the bus answers, for as long as the service lives: a bus outage
  delays them, it never turns into a redelivery; the message is kept un-acked meanwhile, its
  ack deadline pushed back by in-progress acks;
- a redelivered command with a claim and no record was begun by an executor that died
  before recording its outcome. Whether it ran is told by the fence: the same as now, it
  did not take effect and runs (e.g. the attempt a restart was to replace is still the
  current one); another, it is not run again and its result says the outcome is unknown, so
  a restart that already happened never kills the healthy attempt it started. An executor
  without a fence (its actions idempotent) runs it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg

from goodput import schemas, subjects
from goodput.bus.client import OUTAGE_ERRORS, Bus
from goodput.bus.consumer import DurableConsumer
from goodput.telemetry import tracer

log = logging.getLogger(__name__)


#: an executor returns (ok, detail)
Executor = Callable[[schemas.Command], Awaitable[tuple[bool, str]]]
#: what the executor's state is now, as far as ``command`` acts on it ("" : no fence)
Fence = Callable[[schemas.Command], str]

T = TypeVar("T")

#: an in-progress ack lost: the bus away, or any other nats error; the next may get through
_PROGRESS_LOST: tuple[type[BaseException], ...] = (*OUTAGE_ERRORS, nats.errors.Error)


def _no_fence(command: schemas.Command) -> str:
    return ""


async def until_stored(operation: Callable[[], Awaitable[T]], what: str) -> T:
    """Run ``operation`` until it succeeds, through any bus outage, for as long as the caller
    lives (cancelling it is the only way out): a lost write here would repeat a command, a
    failed read reorder them. Only an outage is tried again: any other error (a bucket lost
    with the server's store) fails the handling, the message is redelivered and its claim
    decides, rather than a service stuck retrying what cannot succeed."""
    delay, failures = 0.05, 0
    while True:
        try:
            return await operation()
        except OUTAGE_ERRORS as exc:
            failures += 1
            if failures == 1 or failures % 30 == 0:
                log.warning("%s: bus unavailable (%r); trying again", what, exc)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)


async def request(
    bus: Bus,
    target: str,
    command: schemas.Command,
    timeout_s: float,
    *,
    poll_s: float = 0.1,
    abandon: Callable[[], bool] = lambda: False,
) -> schemas.ActionResult | None:
    """Send ``command`` to ``target``'s executor and wait for the result it records (by id, in
    the done log, so an executor that ran it before a redelivery answers the same): None when
    none came within ``timeout_s``, or sooner once ``abandon()`` says the executor is gone."""
    await bus.send_command(target, command)
    done = DoneLog(bus, command.job, target)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = await done.result(command.command_id)
        if result is not None:
            return result
        if abandon():
            return None
        await asyncio.sleep(poll_s)
    return None


class DoneLog:
    """Which command ids an executor has begun and run, kept in JetStream KV."""

    def __init__(self, bus: Bus, job: str, executor: str):
        self.bus = bus
        self.job = job
        self.executor = executor

    def _key(self, command_id: str) -> str:
        return subjects.kv_key(self.job, self.executor, command_id)

    def _claim_key(self, command_id: str) -> str:
        return subjects.kv_key(self.job, self.executor, command_id, "claim")

    async def _get(self, key: str) -> bytes | None:
        kv = await self.bus.kv(subjects.DONE_BUCKET)
        try:
            entry = await kv.get(key)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return None
        return entry.value or b""

    async def result(self, command_id: str) -> schemas.ActionResult | None:
        """The recorded result of an executed command, or None if it has not run."""
        value = await self._get(self._key(command_id))
        if value is None:
            return None
        result = schemas.decode_event(value)
        return result if isinstance(result, schemas.ActionResult) else None

    async def is_done(self, command_id: str) -> bool:
        return await self.result(command_id) is not None

    async def claim(self, command_id: str) -> schemas.CommandClaim | None:
        """Who began the command and on what state, or None if nobody did."""
        value = await self._get(self._claim_key(command_id))
        return None if value is None else schemas.decode_claim(value)

    async def record_claim(self, claim: schemas.CommandClaim) -> None:
        kv = await self.bus.kv(subjects.DONE_BUCKET)
        await kv.put(self._claim_key(claim.command_id), schemas.encode(claim))

    async def record(self, command_id: str, result: schemas.ActionResult) -> None:
        kv = await self.bus.kv(subjects.DONE_BUCKET)
        await kv.put(self._key(command_id), schemas.encode(result))


class CommandRunner:
    """A durable consumer of ``gp.<job>.cmd.<target>`` that runs each command once."""

    def __init__(
        self,
        bus: Bus,
        *,
        job: str,
        target: str,
        service: str,
        execute: Executor,
        fence: Fence = _no_fence,
        ack_wait_s: float = 30.0,
    ):
        self.bus = bus
        self.job = job
        self.service = service
        self.execute = execute
        self.fence = fence
        self.done = DoneLog(bus, job, target)
        #: names this runner in its claims (for the operator: who began a command)
        self.claimant = f"{service}:{os.getpid()}:{schemas.new_id()[:12]}"
        self.executed = 0
        self.duplicates = 0
        #: redelivered commands begun by a runner that died, whose state has moved since
        self.not_repeated = 0
        self._tracer = tracer(f"goodput.{service}")
        self.consumer = DurableConsumer(
            bus,
            stream=subjects.COMMANDS_STREAM,
            durable=f"{job}-{target}",
            subject=subjects.command(job, target),
            decode=schemas.decode_command,
            handler=self._handle,
            service=service,
            job=job,
            ack_wait_s=ack_wait_s,
        )
        self._progress_every_s = ack_wait_s / 3

    async def run(self) -> None:
        await self.consumer.run()

    def stop(self) -> None:
        self.consumer.stop()

    async def _handle(self, command: schemas.Command, msg: Msg | None) -> None:
        """Handle one delivery, telling the server it is in progress until it is settled."""
        keep_alive = asyncio.create_task(self._in_progress(msg)) if msg is not None else None
        try:
            await self._run_once(command)
        finally:
            if keep_alive is not None:
                keep_alive.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await keep_alive

    async def _in_progress(self, msg: Msg) -> None:
        """Push the ack deadline back while the command runs or its record waits for the bus."""
        while True:
            await asyncio.sleep(self._progress_every_s)
            try:
                await msg.in_progress()
            except _PROGRESS_LOST as exc:
                log.debug("in-progress ack lost: %r", exc)

    async def _run_once(self, command: schemas.Command) -> None:
        action = schemas.kind_of(type(command))
        what = {"command_id": command.command_id, "action": action}
        # read through an outage too: a failed read nak'ed the command, and the commands
        # after it ran before its redelivery (seen when the stream's leader was killed)
        done = await until_stored(
            lambda: self.done.is_done(command.command_id), f"looking up {action}"
        )
        if done:
            self.duplicates += 1
            log.info("command already executed; not repeating it", extra=what)
            return
        fence = self.fence(command)
        claim = await until_stored(
            lambda: self.done.claim(command.command_id), f"looking up the claim of {action}"
        )
        # the fence alone decides: a claim of this runner's own (a record that failed with an
        # error other than an outage) ran if the state moved, and did not if it did not
        if claim is not None and claim.fence != fence:
            detail = (
                f"begun by {claim.claimant}, which never recorded its outcome; the state it "
                f"acted on has changed since ({claim.fence!r} -> {fence!r}), so the command is "
                "not run again: its outcome is unknown"
            )
            log.warning("command not repeated: %s", detail, extra=what)
            self.not_repeated += 1
            await self._settle(command, ok=False, detail=detail, duration_s=0.0, duplicate=True)
            return
        claim = schemas.CommandClaim(
            job=self.job, command_id=command.command_id, claimant=self.claimant, fence=fence
        )
        await until_stored(lambda: self.done.record_claim(claim), f"claiming {action}")
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
            self.executed += 1
            await self._settle(command, ok=ok, detail=detail, duration_s=time.monotonic() - started)

    async def _settle(
        self,
        command: schemas.Command,
        *,
        ok: bool,
        detail: str,
        duration_s: float,
        duplicate: bool = False,
    ) -> None:
        """Record the outcome until it is stored, then publish it (once: its message id is
        the command's)."""
        result = schemas.ActionResult(
            job=self.job,
            command_id=command.command_id,
            action=schemas.kind_of(type(command)),
            ok=ok,
            detail=detail,
            duration_s=duration_s,
            duplicate=duplicate,
        )
        await until_stored(
            lambda: self.done.record(command.command_id, result),
            f"recording the outcome of {result.action}",
        )
        await until_stored(
            lambda: self.bus.publish(
                subjects.event_for(result), result, msg_id=f"{command.command_id}.result"
            ),
            f"publishing the outcome of {result.action}",
        )
