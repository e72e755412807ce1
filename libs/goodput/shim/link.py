"""The trainer's connection to the bus, on a thread of its own.

The training loop is synchronous and must never wait on the network: events go into a queue
that a background asyncio loop drains (retrying through outages), heartbeats are sent from
that loop on a timer, and commands for trainers arrive there (``command_feed``: a core
subscription, no consumer per rank) and are handed to a callback. Step reports go to the
node's first local rank, whose link publishes them rolled up (``step_rollup``); a report that
cannot get there is published by its own rank's link.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import threading
import time
from collections.abc import Callable

from opentelemetry.context import Context

from goodput import schemas, subjects
from goodput.bus import Bus, BusSettings, BusSettingsError
from goodput.shim.command_feed import CommandFeed
from goodput.shim.step_rollup import StepAggregator, StepSender, channel_name
from goodput.telemetry import attached

log = logging.getLogger(__name__)

_CLOSE = object()

#: how long one wait for the next queued event lasts: the wait runs on the loop's default
#: executor, whose worker threads the interpreter joins at exit, so a wait with no end would
#: keep a rank that never closes its link (a script that raised) from ever exiting
EVENT_POLL_S = 0.5


class BusLink:
    """Background publisher of heartbeats and events, and receiver of trainer commands."""

    def __init__(
        self,
        *,
        settings: BusSettings,
        job: str,
        node: str,
        rank: int,
        heartbeat_period_s: float,
        on_command: Callable[[schemas.Command], None],
        commands_since_ns: int | None = None,
        local_rank: int = 0,
        local_world_size: int = 1,
        attempt: int = 1,
    ):
        self.settings = settings
        self.job = job
        self.node = node
        self.rank = rank
        self.heartbeat_period_s = heartbeat_period_s
        self.on_command = on_command
        self.step = 0
        #: what the rank is busy with ("checkpoint-save", "checkpoint-load") or ""
        self.busy = ""
        self.connected = threading.Event()
        #: why the link gave up on the bus ("" while connected or still trying)
        self.failure = ""
        self._events: queue.Queue[object] = queue.Queue()
        #: the trainer's commands are read from then: the rank's launch, never the future
        self._commands_since_ns = min(commands_since_ns or time.time_ns(), time.time_ns())
        self._aggregator, self._steps = self._step_channel(local_rank, local_world_size, attempt)
        self._thread = threading.Thread(target=self._main, name="goodput-bus-link", daemon=True)
        self._thread.start()

    def _step_channel(
        self, local_rank: int, local_world_size: int, attempt: int
    ) -> tuple[StepAggregator | None, StepSender | None]:
        """The node's aggregator when this is its first local rank (None if its channel is
        taken), and the sender of this rank's steps to it (None: it publishes its own; rank 0
        always reaches the controller's filter itself, as its node's first rank or directly)."""
        address = channel_name(self.settings.url, self.job, attempt, self.node)
        aggregator = None
        if local_rank == 0 and local_world_size > 1:
            aggregator = StepAggregator.bind(
                address,
                job=self.job,
                node=self.node,
                rank=self.rank,
                ranks=local_world_size,
                emit=lambda rollup: self._events.put((rollup, None)),
            )
        rolls_up = aggregator is not None or (local_rank != 0 and self.rank != 0)
        return aggregator, StepSender(address) if rolls_up else None

    def publish(self, event: schemas.Event, context: Context | None = None) -> None:
        """Queue an event; returns at once. ``context``: the trace it is published in (its
        ``traceparent`` header), since this thread's context does not reach the bus loop. A
        step report without a trace to carry goes to the node's rollup if it can."""
        if (
            self._steps is not None
            and context is None
            and type(event) is schemas.StepDone
            and self._steps.send(event)
        ):
            return
        self._events.put((event, context))

    def close(self, timeout_s: float = 10.0) -> None:
        """Send the node's pending steps, flush queued events (bounded by ``timeout_s``) and
        stop the thread."""
        if self._aggregator is not None:
            self._aggregator.close()
        if self._steps is not None:
            self._steps.close()
        self._events.put(_CLOSE)
        self._thread.join(timeout_s)

    # ---- the background loop ------------------------------------------------------------------

    def _main(self) -> None:
        asyncio.run(self._run())

    async def _run(self) -> None:
        # Telemetry must never stop training: whatever goes wrong here is logged as an error
        # naming the cause, and the rank trains on unsupervised (no heartbeats, step events
        # or commands; under the actuator, the sensor then reports its missing heartbeats).
        try:
            bus = await Bus.connect(self.settings, name=f"goodput-trainer-{self.rank}")
        except BusSettingsError as exc:
            self._give_up(str(exc))
            return
        except Exception as exc:
            self._give_up(f"cannot connect to {self.settings.describe()}: {exc!r}")
            return
        heartbeats = asyncio.create_task(self._heartbeats(bus))
        commands = await self._subscribe_commands(bus)
        # set once commands sent from now on reach the rank live (tests wait for it)
        self.connected.set()
        try:
            await self._publish_events(bus)
        finally:
            heartbeats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeats
            # the last beat says the rank is leaving: the silence until its exit report (a
            # slow interpreter teardown on a loaded host) is then no missed heartbeat
            self.busy = schemas.BUSY_EXITING
            with contextlib.suppress(Exception):
                await bus.publish_core(self._subject, self._beat())
            if commands is not None:
                await commands.stop()
            await bus.close()

    def _give_up(self, reason: str) -> None:
        self.failure = reason
        log.error(
            "goodput: rank %d is NOT supervised: %s; it trains on without heartbeats, step "
            "events or commands (set GOODPUT_NATS_* as the services have them)",
            self.rank,
            reason,
        )
        self._drain_without_bus()

    def _drain_without_bus(self) -> None:
        while self._events.get() is not _CLOSE:
            pass

    async def _publish_events(self, bus: Bus) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                item = await loop.run_in_executor(None, self._next_event)
            except RuntimeError:  # the interpreter is exiting: its executor takes no more work
                return
            if item is None:
                continue
            if item is _CLOSE:
                return
            assert isinstance(item, tuple)
            event, context = item
            try:
                with attached(context):
                    await bus.emit(event, retry_for_s=60)
            except Exception:
                log.exception("event lost after retries", extra={"event": type(event).__name__})

    def _next_event(self) -> object | None:
        try:
            return self._events.get(timeout=EVENT_POLL_S)
        except queue.Empty:
            return None

    @property
    def _subject(self) -> str:
        return subjects.heartbeat(self.job, self.node, self.rank)

    def _beat(self) -> schemas.Heartbeat:
        return schemas.Heartbeat(
            job=self.job,
            node=self.node,
            rank=self.rank,
            pid=os.getpid(),
            step=self.step,
            busy=self.busy,
        )

    async def _heartbeats(self, bus: Bus) -> None:
        while True:
            with contextlib.suppress(Exception):  # a missed beat is what the sensor detects
                await bus.publish_core(self._subject, self._beat())
            await asyncio.sleep(self.heartbeat_period_s)

    async def _subscribe_commands(self, bus: Bus) -> CommandFeed | None:
        """Commands for trainers sent since this process was launched (older ones were for
        others), through a core subscription and a lookup: ``command_feed`` says the rule."""

        async def reject(subject: str, reason: str, payload: bytes) -> None:
            await bus.dead_letter(
                job=self.job,
                service=f"trainer-{self.rank}",
                subject=subject,
                reason=reason,
                payload=payload,
            )

        feed = CommandFeed(
            bus,
            job=self.job,
            since_ns=self._commands_since_ns,
            on_command=self.on_command,
            reject=reject,
        )
        try:
            await feed.start()
        except Exception:
            log.exception("cannot subscribe to trainer commands; they will be missed")
            await feed.stop()
            return None
        return feed


def wait_for_bus(link: BusLink | None, timeout_s: float = 10.0) -> bool:
    """Block until ``link`` (a shim's) is connected and its trainer commands arrive live
    (tests and short jobs use this)."""
    if link is None:
        return False
    deadline = time.monotonic() + timeout_s
    while not link.failure:  # a link that gave up will not connect: no use waiting
        remaining = deadline - time.monotonic()
        if link.connected.wait(max(min(remaining, 0.05), 0)) or remaining <= 0:
            break
    return link.connected.is_set()
