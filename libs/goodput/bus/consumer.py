"""Durable pull consumers: decode strictly, dead-letter what cannot be decoded or came on
another job's (or kind's) subject (``subjects.mismatch``), ack after handling.

A message is acked only after its handler returned, so a service killed mid-handling gets the
message again when it restarts; the consumer's position lives in the server, so a restarted
service resumes where it stopped. A handler that keeps failing is dead-lettered after
``max_deliver`` attempts instead of blocking the stream forever.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from goodput import schemas, subjects
from goodput.bus.client import BUS_ERRORS, OUTAGE_ERRORS, Bus
from goodput.telemetry import TRACEPARENT, extract_context, tracer

log = logging.getLogger(__name__)


Handler = Callable[[Any, Msg], Awaitable[None]]
Decoder = Callable[[bytes], Any]


class DurableConsumer:
    """Feed the messages of ``subject`` in ``stream`` to ``handler``, one at a time, in order.

    ``subject`` may be several filters (``subjects.events_read``): the server then delivers
    only what matches one of them (``filter_subjects``, NATS 2.10+). A durable created with
    other filters is updated in place, keeping its position: the server allows that change.
    """

    def __init__(
        self,
        bus: Bus,
        *,
        stream: str,
        durable: str,
        subject: str | Sequence[str],
        decode: Decoder,
        handler: Handler,
        service: str,
        job: str,
        batch: int = 64,
        max_deliver: int = 5,
        ack_wait_s: float = 30.0,
        deliver_new_only: bool = False,
    ):
        self.bus = bus
        self.stream = stream
        self.durable = durable
        self.decode = decode
        self.handler = handler
        self.service = service
        self.job = job
        self.batch = batch
        self.max_deliver = max_deliver
        filters = [subject] if isinstance(subject, str) else list(subject)
        self.config = ConsumerConfig(
            durable_name=durable,
            filter_subject=filters[0] if len(filters) == 1 else None,
            filter_subjects=filters if len(filters) > 1 else None,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=ack_wait_s,
            max_deliver=max_deliver + 1,  # the extra delivery is where we dead-letter it
            deliver_policy=DeliverPolicy.NEW if deliver_new_only else DeliverPolicy.ALL,
            max_ack_pending=1000,
        )
        self.handled = 0
        self.dead_lettered = 0
        #: messages acked without a dead letter because storing the letter failed
        self.undeliverable = 0
        self._stopping = asyncio.Event()
        self._tracer = tracer(f"goodput.{service}")

    def stop(self) -> None:
        self._stopping.set()

    async def _subscribe(self) -> Any:
        await self.bus.js.add_consumer(self.stream, self.config)
        return await self.bus.js.pull_subscribe_bind(self.durable, self.stream)

    async def run(self) -> None:
        """Consume until :meth:`stop`; outages are waited out, never fatal."""
        subscription = None
        while not self._stopping.is_set():
            try:
                if subscription is None:
                    subscription = await self._subscribe()
                messages = await subscription.fetch(self.batch, timeout=1.0)
            except nats.errors.TimeoutError:
                continue
            except BUS_ERRORS as exc:
                log.debug("consumer %s waiting for the bus: %r", self.durable, exc)
                subscription = (
                    None if isinstance(exc, nats.js.errors.NotFoundError) else subscription
                )
                await asyncio.sleep(0.25)
                continue
            for message in messages:
                try:
                    await self._handle(message)
                except asyncio.CancelledError:
                    raise
                except Exception:  # a defect in handling one message must not stop the stream
                    log.exception("handling a message failed", extra={"consumer": self.durable})
                    await self._settle(message.nak(delay=1.0))

    async def _handle(self, msg: Msg) -> None:
        try:
            decoded = self.decode(msg.data)
        except schemas.SchemaError as exc:
            await self._dead_letter(msg, f"undecodable: {exc}")
            return
        except Exception as exc:  # a decoder's own defect must not stop the stream either
            await self._dead_letter(msg, f"undecodable ({type(exc).__name__}): {exc}")
            return
        misrouted = subjects.mismatch(msg.subject, decoded)
        if misrouted:
            await self._dead_letter(msg, f"wrong subject: {misrouted}")
            return
        delivered = msg.metadata.num_delivered if msg.metadata else 1
        if delivered > self.max_deliver:
            await self._dead_letter(msg, f"handler failed {self.max_deliver} times")
            return
        try:
            if msg.headers and TRACEPARENT in msg.headers:
                # part of a traced operation (a remediation): continue its trace
                with self._tracer.start_as_current_span(
                    f"{self.service} handle {type(decoded).__name__}",
                    context=extract_context(msg.headers),
                ):
                    await self.handler(decoded, msg)
            else:
                await self.handler(decoded, msg)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception(
                "handler failed; will retry",
                extra={"subject": msg.subject, "attempt": delivered, "consumer": self.durable},
            )
            await self._settle(msg.nak(delay=min(0.5 * delivered, 5.0)))
            return
        self.handled += 1
        await self._settle(msg.ack())

    async def _dead_letter(self, msg: Msg, reason: str) -> None:
        """Dead-letter and ack; a letter that cannot be stored is logged, never fatal.

        Through an outage the message is nak'ed (dead-lettered on redelivery); any other
        failure would repeat on every redelivery, so the message is acked with the error logged.
        """
        log.error(
            "dead-lettering a message",
            extra={"subject": msg.subject, "reason": reason[:500], "consumer": self.durable},
        )
        try:
            await self.bus.dead_letter(
                job=self.job,
                service=self.service,
                subject=msg.subject,
                reason=reason,
                payload=msg.data,
                stream_seq=msg.metadata.sequence.stream if msg.metadata else 0,
            )
        except asyncio.CancelledError:
            raise
        except OUTAGE_ERRORS as exc:
            log.error("dead letter not stored (%r); the message will be redelivered", exc)
            await self._settle(msg.nak(delay=1.0))
            return
        except Exception as exc:
            log.error(
                "dead letter not stored (%r); acking the message anyway",
                exc,
                extra={"subject": msg.subject, "size": len(msg.data), "consumer": self.durable},
            )
            self.undeliverable += 1
            await self._settle(msg.ack())
            return
        self.dead_lettered += 1
        await self._settle(msg.ack())

    async def _settle(self, ack: Awaitable[None]) -> None:
        """An ack lost to an outage only means a redelivery, which idempotency absorbs."""
        try:
            await ack
        except BUS_ERRORS as exc:
            log.warning("ack lost (%r); the message will be redelivered", exc)
