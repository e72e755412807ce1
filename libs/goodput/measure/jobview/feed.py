"""Feeds a :class:`JobModel` from the bus: the job's stored events from the first one, then
live ones (:class:`goodput.bus.job_events.JobEvents`), plus heartbeats (core NATS, never
stored, so only live ones exist).

The view is a fold of the whole history, so opening it late shows the same state as having
watched from the start.
"""

from __future__ import annotations

import asyncio
import logging

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from goodput import schemas, subjects
from goodput.bus import Bus
from goodput.bus.job_events import JobEvents
from goodput.bus.routing import decode_event_on
from goodput.measure.jobview.model import JobModel

log = logging.getLogger(__name__)


class JobFeed:
    """Applies every event and heartbeat of ``model.job`` to ``model`` as it arrives."""

    def __init__(self, bus: Bus, model: JobModel) -> None:
        self.bus = bus
        self.model = model
        self._events = JobEvents(bus, model.job, model.apply, keep=False)
        #: heartbeats that did not decode (undecodable events: ``JobEvents.undecodable``)
        self.undecodable_heartbeats = 0
        self._heartbeats: Subscription | None = None

    @property
    def caught_up(self) -> asyncio.Event:
        """Set once the events stored when the feed started have all been applied."""
        return self._events.caught_up

    async def start(self) -> JobFeed:
        self._heartbeats = await self.bus.nc.subscribe(
            subjects.heartbeats_of(self._events.job),
            cb=self._on_heartbeat,
            pending_msgs_limit=200_000,
        )
        await self._events.start()
        return self

    async def wait_caught_up(self, timeout_s: float) -> bool:
        return await self._events.wait_caught_up(timeout_s)

    async def stop(self) -> None:
        for stop in (self._events.stop, self._unsubscribe_heartbeats):
            try:
                await stop()
            except Exception:  # the connection may be gone already; nothing to clean up then
                log.debug("unsubscribe failed", exc_info=True)

    async def _unsubscribe_heartbeats(self) -> None:
        if self._heartbeats is not None:
            await self._heartbeats.unsubscribe()
            self._heartbeats = None

    async def _on_heartbeat(self, msg: Msg) -> None:
        try:
            beat = decode_event_on(msg.subject, msg.data)
        except schemas.SchemaError:
            self.undecodable_heartbeats += 1  # high-rate and unstored: counted, as the sensor does
            return
        if isinstance(beat, schemas.Heartbeat):
            self.model.apply(beat)
