"""The sensor service process: job events and heartbeats in, signals out.

Facts (rank starts and exits, steps, checkpoints, host health) come through a durable
consumer, so a restarted sensor resumes where it stopped; heartbeats come over core NATS. The
``Detector`` holds the logic; this process feeds it receipt times, polls it every
``heartbeat_polling_period_s`` and publishes what it concludes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from nats.aio.msg import Msg
from opentelemetry.context import Context

from goodput import schemas, subjects
from goodput.bus import Bus, DurableConsumer
from goodput.config import ServiceConfig
from goodput.measure.metrics import JobProgressMetrics
from goodput.supervisor.detect.detector import Detector
from goodput.supervisor.detect.thresholds import Thresholds, updated
from goodput.telemetry import link_to_current, tracer
from goodput_services.base import Service
from goodput_services.sensor.heartbeats import HeartbeatFeed
from goodput_services.sensor.options import SensorOptions

log = logging.getLogger(__name__)


class SensorService(Service):
    name = "sensor"
    command_target = subjects.SENSOR
    options_type = SensorOptions
    options: SensorOptions

    def __init__(self, config: ServiceConfig):
        super().__init__(config)
        self.detector = Detector(self.job, self.options.thresholds)
        self.signals_sent = 0
        self._feed: HeartbeatFeed | None = None
        self._feed_started = asyncio.Event()
        #: how far behind the clock the last poll judged (s): the time it took to read the
        #: beats queued ahead of its round trip
        self.behind_s = 0.0
        self._tracer = tracer("goodput.sensor")
        self.progress = JobProgressMetrics(self.job)

    @property
    def thresholds(self) -> Thresholds:
        return self.detector.thresholds

    def loops(self):
        return [self._consume_events(), self._consume_heartbeats(), self._poll()]

    async def execute(self, command: schemas.Command) -> tuple[bool, str]:
        if isinstance(command, schemas.SetThresholds):
            try:
                self.detector.set_thresholds(updated(self.thresholds, command.values))
            except ValueError as exc:
                return False, str(exc)
            log.info("thresholds changed", extra={"values": command.values})
            return True, f"thresholds now {self.thresholds}"
        return await super().execute(command)

    @property
    def heartbeats(self) -> int:
        """Heartbeats taken off the bus and understood."""
        return self._feed.taken - self._feed.undecodable if self._feed is not None else 0

    @property
    def undecodable_heartbeats(self) -> int:
        return self._feed.undecodable if self._feed is not None else 0

    def health(self) -> tuple[bool, str]:
        return True, (
            f"{self.signals_sent} signal(s) sent, {self.heartbeats} heartbeat(s) seen"
            + (
                f", {self.undecodable_heartbeats} undecodable"
                if self.undecodable_heartbeats
                else ""
            )
            + f", deadlines judged {self.behind_s:.2f} s behind"
        )

    async def _publish(self, signals: list[schemas.Signal]) -> None:
        assert self.bus is not None
        for signal in signals:
            # the root of a remediation's trace (decision, action and resume hang under it),
            # linked to whatever trace the event that revealed the fault belonged to
            with self._tracer.start_as_current_span(
                f"signal {signal.signal}",
                context=Context(),
                links=link_to_current(),
                attributes={
                    "goodput.job": self.job,
                    "goodput.signal": signal.signal,
                    "goodput.signal_id": signal.signal_id,
                    "goodput.node": signal.node,
                    "goodput.severity": signal.severity,
                },
            ):
                log.warning(
                    "signal",
                    extra={"signal": signal.signal, "node": signal.node, "detail": signal.detail},
                )
                await self.bus.emit(signal)
            self.signals_sent += 1
            self.progress.signal(signal.signal)

    async def _consume_events(self) -> None:
        assert self.bus is not None

        async def handle(event: schemas.Event, msg: Msg) -> None:
            for each in schemas.expand_steps(event):  # a node's rollup: its ranks' steps
                self.progress.observe(each)
                await self._publish(self.detector.on_event(each, time.time_ns()))

        consumer = DurableConsumer(
            self.bus,
            stream=subjects.EVENTS_STREAM,
            durable=f"{self.job}-sensor",
            subject=subjects.events_of(self.job),
            decode=schemas.decode_event,
            handler=handle,
            service=self.name,
            job=self.job,
            batch=256,
        )
        stopper = asyncio.create_task(self._stop_when_asked(consumer))
        try:
            await consumer.run()
        finally:
            stopper.cancel()

    async def _stop_when_asked(self, consumer: DurableConsumer) -> None:
        await self.stopping.wait()
        consumer.stop()

    async def _consume_heartbeats(self) -> None:
        assert self.bus is not None and self._feed is None
        pending: list[schemas.Signal] = []

        def on_beat(beat: schemas.Heartbeat, now: int) -> None:
            pending.extend(self.detector.on_heartbeat(beat, now))

        # a connection of their own: one TCP stream delivers in order, so on the service's
        # connection every answer to the event consumer's fetches would wait behind the
        # beats queued ahead of it in the socket, however fairly the loop runs
        beats_bus = await Bus.connect(self.config.bus, name=f"goodput-{self.name}-heartbeats")
        self._feed = HeartbeatFeed(beats_bus.nc, self.job, on_beat)
        await self._feed.start()
        self._feed_started.set()
        try:
            while not self.stopping.is_set():
                if pending:
                    batch, pending[:] = list(pending), []
                    await self._publish(batch)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), 0.05)
        finally:
            with contextlib.suppress(Exception):
                await self._feed.stop()
            await beats_bus.close()

    async def _poll(self) -> None:
        await self._feed_started.wait()
        assert self._feed is not None
        while not self.stopping.is_set():
            # silence is judged only up to what the sensor has read: its own backlog of
            # beats must not read as the ranks' (``HeartbeatFeed.read_until_now``)
            heard_until = await self._feed.read_until_now()
            if heard_until is None:
                if not self.stopping.is_set():
                    log.warning("the bus did not answer a round trip: deadlines not checked")
            else:
                self.behind_s = (time.time_ns() - heard_until) / 1e9
                await self._publish(self.detector.poll(heard_until))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self.stopping.wait(), self.thresholds.heartbeat_polling_period_s
                )


SERVICE = SensorService
