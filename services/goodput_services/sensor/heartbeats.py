"""The sensor's heartbeat feed: fair to the service's other loops, and honest about its backlog.

nats-py runs a subscription's callbacks from one task that takes the next message without
yielding while its queue is non-empty, so a heartbeat stream the sensor cannot drain would
starve its event consumer and its poll. The callback yields to the loop every
``YIELD_EVERY`` beats (``asyncio.sleep(0)`` costs about a beat's decoding; see
docs/BENCHMARKS.md, issue 36).

A beat still queued unread — in the socket, in nats-py's queue — is evidence its rank was
alive, and the detector stamps each beat with the time the sensor reads it. So silence may
only be judged up to the last instant before which everything delivered has been read:
:meth:`HeartbeatFeed.read_until_now` sends the server a PING (answered in order after every
message it already routed to this connection), waits for the callback to take every beat
queued ahead of the PONG, and returns the time the PING left. A sensor behind on its beats
then judges late, never wrongly; a caught-up one a round trip after the fact.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import TimeoutError as NatsTimeoutError

from goodput import schemas, subjects
from goodput.bus.routing import decode_event_on

log = logging.getLogger(__name__)

#: beats handled between yields to the event loop
YIELD_EVERY = 64
#: how long a PING may wait for its PONG before the poll gives up this round (s)
ROUND_TRIP_TIMEOUT_S = 30


class HeartbeatFeed:
    """One job's heartbeat subscription, read fairly and with a read-up-to watermark."""

    def __init__(self, nc: Client, job: str, on_beat: Callable[[schemas.Heartbeat, int], None]):
        self._nc = nc
        self._job = job
        self._on_beat = on_beat
        self._subscription: Subscription | None = None
        #: messages the callback has taken off the subscription's queue
        self.taken = 0
        self.undecodable = 0
        self._until_yield = YIELD_EVERY
        self._target = 0
        self._reached: asyncio.Future[None] | None = None

    async def start(self) -> None:
        self._subscription = await self._nc.subscribe(
            subjects.heartbeats_of(self._job), cb=self._handle, pending_msgs_limit=200_000
        )

    async def stop(self) -> None:
        if self._subscription is not None:
            subscription, self._subscription = self._subscription, None
            if self._reached is not None:
                self._reached.set_result(None)  # no more beats: the waiting poll gets None
            await subscription.unsubscribe()

    @property
    def backlog(self) -> int:
        """Beats delivered into nats-py's queue and not yet taken."""
        return self._subscription.pending_msgs if self._subscription is not None else 0

    async def read_until_now(self) -> int | None:
        """An instant (epoch ns) before which every beat the server routed here has been
        handled; None when the server did not answer within ``ROUND_TRIP_TIMEOUT_S`` or the
        feed stopped first."""
        sent = time.time_ns()
        try:
            await self._nc.flush(timeout=ROUND_TRIP_TIMEOUT_S)
        except NatsTimeoutError:
            return None
        target = self.taken + self.backlog
        if self.taken < target:
            self._target = target
            self._reached = asyncio.get_running_loop().create_future()
            try:
                await self._reached
            finally:
                self._reached = None
        return sent if self._subscription is not None else None

    async def _handle(self, msg: Msg) -> None:
        self.taken += 1
        try:
            beat = decode_event_on(msg.subject, msg.data)
            if not isinstance(beat, schemas.Heartbeat):
                raise schemas.SchemaError(f"{type(beat).__name__} is not a heartbeat")
        except schemas.SchemaError:
            # high-rate and unstored: counted, not dead-lettered
            self.undecodable += 1
        else:
            try:
                self._on_beat(beat, time.time_ns())
            except Exception:  # one odd beat must not end heartbeat tracking
                log.exception("heartbeat not understood", extra={"subject": msg.subject})
        if self._reached is not None and self.taken >= self._target:
            self._reached.set_result(None)
            self._reached = None
        self._until_yield -= 1
        if not self._until_yield:
            self._until_yield = YIELD_EVERY
            await asyncio.sleep(0)
