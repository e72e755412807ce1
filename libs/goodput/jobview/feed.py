"""Feeds a :class:`JobModel` from the bus: the job's stored events from the first one, then
live ones, plus heartbeats (core NATS, never stored, so only live ones exist).

The stream is read with an ephemeral ordered consumer from ``DeliverPolicy.ALL``, like
:func:`goodput.accounting.replay_from_bus`: the view is a fold of the whole history, so
opening it late shows the same state as having watched from the start.
"""

from __future__ import annotations

import asyncio
import logging

from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy

from goodput import schemas, subjects
from goodput.accounting.sources import count_events
from goodput.bus import Bus
from goodput.jobview.model import JobModel

log = logging.getLogger(__name__)


class JobFeed:
    """Applies every event and heartbeat of ``model.job`` to ``model`` as it arrives."""

    def __init__(self, bus: Bus, model: JobModel) -> None:
        self.bus = bus
        self.model = model
        #: set once the events stored when the feed started have all been applied
        self.caught_up = asyncio.Event()
        self.undecodable = 0
        self._subscriptions: list = []

    async def start(self) -> JobFeed:
        job = subjects.check_token(self.model.job, "job name")
        stored = await count_events(self.bus, job)
        self._subscriptions.append(
            await self.bus.nc.subscribe(
                subjects.heartbeats_of(job), cb=self._on_heartbeat, pending_msgs_limit=200_000
            )
        )
        if stored == 0:
            self.caught_up.set()
            if not await self._stream_exists():
                return self  # a bus never provisioned: nothing stored, nothing to follow
        self._subscriptions.append(
            await self.bus.js.subscribe(
                subjects.events_of(job),
                stream=subjects.EVENTS_STREAM,
                cb=self._on_event,
                ordered_consumer=True,
                config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
                pending_msgs_limit=200_000,
            )
        )
        return self

    async def _stream_exists(self) -> bool:
        try:
            await self.bus.js.stream_info(subjects.EVENTS_STREAM)
        except Exception:
            return False
        return True

    async def wait_caught_up(self, timeout_s: float) -> bool:
        """True once the history is applied; False if ``timeout_s`` passed first."""
        try:
            await asyncio.wait_for(self.caught_up.wait(), timeout_s)
        except TimeoutError:
            return False
        return True

    async def stop(self) -> None:
        for subscription in self._subscriptions:
            try:
                await subscription.unsubscribe()
            except Exception:  # the connection may be gone already; nothing to clean up then
                log.debug("unsubscribe failed", exc_info=True)
        self._subscriptions.clear()

    async def _on_event(self, msg: Msg) -> None:
        try:
            self.model.apply(schemas.decode_event(msg.data))
        except schemas.SchemaError as exc:
            self.undecodable += 1
            log.warning("skipping undecodable event on %s: %s", msg.subject, exc)
        if msg.metadata.num_pending == 0:
            self.caught_up.set()

    async def _on_heartbeat(self, msg: Msg) -> None:
        try:
            beat = schemas.decode_event(msg.data)
        except schemas.SchemaError:
            self.undecodable += 1  # high-rate and unstored: counted, like the sensor does
            return
        if isinstance(beat, schemas.Heartbeat):
            self.model.apply(beat)
