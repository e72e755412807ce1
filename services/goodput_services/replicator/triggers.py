"""What wakes the replicator's sync before its next poll: the engine's checkpoint events."""

from __future__ import annotations

import asyncio
import contextlib

from nats.aio.msg import Msg

from goodput import schemas, subjects
from goodput.bus import Bus
from goodput.bus.routing import decode_event_on


async def follow_persisted(
    bus: Bus, job: str, node: str, wake: asyncio.Event, stopping: asyncio.Event
) -> None:
    """Set ``wake`` whenever the engine reports a checkpoint of ``node`` persisted, so it is
    indexed and replicated at once instead of up to a poll later.

    Core NATS, from now on, until ``stopping``: what was persisted before the subscription,
    or while the bus was away, the next poll finds.
    """
    kind = schemas.kind_of(schemas.CheckpointPersisted)

    async def on_event(msg: Msg) -> None:
        try:
            event = decode_event_on(msg.subject, msg.data)
        except schemas.SchemaError:
            return  # the sensor's consumer dead-letters it
        if isinstance(event, schemas.CheckpointPersisted) and event.node == node:
            wake.set()

    subscriptions = [
        await bus.nc.subscribe(subject, cb=on_event)
        for subject in subjects.events_of_kind(job, kind)
    ]
    try:
        await stopping.wait()
    finally:
        for subscription in subscriptions:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()
