"""The bus: a NATS connection that survives server restarts, JetStream provisioning, and publishing.

Publishing to JetStream waits for the stream's acknowledgement and retries through an outage
with the same ``Nats-Msg-Id``, so a message published while the server restarts is stored
exactly once (the stream's duplicate window absorbs the retries).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NatsClient
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, KeyValueConfig, PubAck, StreamConfig
from nats.js.kv import KeyValue

from goodput import schemas, subjects
from goodput.bus.connect_refusal import connect_refusal
from goodput.bus.dead_letters import dead_letter_entry
from goodput.bus.settings import BusSettings, stream_replicas
from goodput.bus.store_sizing import (
    DEFAULT_SCALE,
    StoreLimits,
    StoreScale,
    scale_from_env,
    store_limits,
)
from goodput.bus.stores import OLDEST_DROPPED, bucket_configs, stream_configs
from goodput.telemetry import inject_headers

log = logging.getLogger(__name__)


def _not_tls_eof_noise(record: logging.LogRecord) -> bool:
    """nats-py's protocol asks asyncio to keep a connection open at EOF, which asyncio's TLS
    transport cannot and says so as a warning each time a TLS server closes on the client
    (a refused sign-in): a line of noise beside the one line that says why."""
    return not record.getMessage().startswith("returning true from eof_received()")


logging.getLogger("asyncio").addFilter(_not_tls_eof_noise)

#: JetStream's "no suitable peers for placement": a cluster that has just formed, whose meta
#: leader has not yet heard every member's resources, cannot place a replicated stream yet
NO_PLACEMENT_CODE = 10005


class PlacementPendingError(RuntimeError):
    """JetStream cannot place a replicated stream or bucket yet: the cluster is still forming."""


def raise_if_placement_pending(exc: nats.js.errors.APIError) -> None:
    """Turn the server's "no suitable peers" into :class:`PlacementPendingError` (retried like
    an outage) instead of a refusal: under load the first seconds of a cluster answer so."""
    if exc.err_code == NO_PLACEMENT_CODE:
        raise PlacementPendingError(f"{exc.description} (the cluster is still forming)") from exc


#: errors that mean "the server is not reachable right now": retry, don't fail
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.StaleConnectionError,
    nats.js.errors.ServiceUnavailableError,
    # a stream between leaders (a Raft election in a cluster) has nobody to answer a publish
    nats.js.errors.NoStreamResponseError,
    PlacementPendingError,
    asyncio.TimeoutError,
    ConnectionError,
    OSError,
)


def service_connection_name(service: str) -> str:
    """The name a service's connection gives the server, which its ``/connz`` lists: how a
    benchmark (or an operator) finds that service's traffic."""
    return f"goodput-{service}"


class BusUnavailableError(RuntimeError):
    """The bus stayed unreachable longer than the caller was willing to wait."""


#: the bus is away for now: a transient error, or it stayed away longer than a call waits
OUTAGE_ERRORS: tuple[type[BaseException], ...] = (*TRANSIENT_ERRORS, BusUnavailableError)
#: any failure of a bus call that is logged and tried again later: a transient error or any
#: other nats reports (JetStream's included)
BUS_ERRORS: tuple[type[BaseException], ...] = (*TRANSIENT_ERRORS, nats.errors.Error)


class StoreTooSmallError(RuntimeError):
    """The server's JetStream store cannot hold the byte limits the bus is sized for."""


#: JetStream's "insufficient storage resources" and "storage resources exceeded" errors
STORE_FULL_CODES = frozenset({10023, 10047})


async def retry_transient(
    operation: Callable[[], Awaitable[Any]], *, deadline_s: float, what: str
) -> Any:
    """Run ``operation`` until it succeeds, backing off on transient bus errors."""
    deadline = time.monotonic() + deadline_s
    delay = 0.05
    while True:
        try:
            return await operation()
        except TRANSIENT_ERRORS as exc:
            if time.monotonic() + delay > deadline:
                raise BusUnavailableError(
                    f"{what}: bus unreachable for {deadline_s:.0f} s ({exc!r})"
                ) from exc
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)


class Bus:
    """One service's connection to NATS JetStream."""

    def __init__(self, nc: NatsClient, settings: BusSettings, name: str):
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.settings = settings
        self.name = name
        self._kv: dict[str, KeyValue] = {}
        self._closing = asyncio.Event()
        self._reconnect_hooks: list[Callable[[], None]] = []

    def on_reconnect(self, hook: Callable[[], None], *, remove: bool = False) -> None:
        """Call ``hook`` (which must not block: it runs in the client's reconnect) after every
        reconnect, once the client's subscriptions are back on the server; or stop calling it."""
        if remove:
            with contextlib.suppress(ValueError):
                self._reconnect_hooks.remove(hook)
        else:
            self._reconnect_hooks.append(hook)

    @classmethod
    async def connect(
        cls, settings: BusSettings, *, name: str, initial_timeout_s: float = 30.0
    ) -> Bus:
        """Connect (retrying until the server is up), reconnecting forever afterwards.

        Settings that cannot work raise at once, in one line: an unauthenticated remote bus
        (``InsecureBusError``), and credentials or TLS files that are missing, unusable, or
        refused by the server (``BusCredentialsError``); retrying would not change them.
        """
        settings.check_security()
        settings.check_credentials()
        options = settings.connect_options()
        closing = asyncio.Event()
        reconnect_hooks: list[Callable[[], None]] = []

        async def on_disconnect() -> None:
            if not closing.is_set():
                log.warning("bus disconnected; reconnecting", extra={"bus": settings.url})

        async def on_reconnect() -> None:
            log.info("bus reconnected", extra={"bus": settings.url})
            for hook in list(reconnect_hooks):
                hook()

        async def on_error(exc: Exception) -> None:
            log.debug("bus error: %r", exc)

        async def attempt() -> NatsClient:
            # The first connection fails fast (so a wrong password is an error, not a hang);
            # once connected, the client reconnects forever.
            client = NatsClient()
            try:
                await client.connect(
                    **options,
                    name=name,
                    connect_timeout=2,
                    allow_reconnect=False,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=0.25,  # type: ignore[arg-type]  # nats-py annotates an int; it is seconds to sleep
                    ping_interval=5,
                    max_outstanding_pings=3,
                    disconnected_cb=on_disconnect,
                    reconnected_cb=on_reconnect,
                    error_cb=on_error,
                )
            except Exception as exc:
                # nats-py keeps the INFO it read before failing; it has no public accessor
                refused = connect_refusal(exc, settings, client._server_info)
                if refused is not None:
                    raise refused from None
                raise
            client.options["allow_reconnect"] = True
            return client

        nc = await retry_transient(
            attempt, deadline_s=initial_timeout_s, what=f"connect to {settings.url}"
        )
        bus = cls(nc, settings, name)
        bus._closing = closing
        bus._reconnect_hooks = reconnect_hooks
        return bus

    @property
    def replicas(self) -> int:
        """Copies of each stream and bucket: the setting, else R3 on a clustered server."""
        # the server's INFO names its cluster; nats-py keeps INFO but has no public accessor
        info: dict[str, Any] = self.nc._server_info
        return stream_replicas(self.settings.replicas, clustered=bool(info.get("cluster")))

    async def provision(
        self, *, scale: StoreScale | None = None, retry_for_s: float = 60.0
    ) -> StoreLimits:
        """Create the streams and KV buckets if missing (idempotent, safe to race), with
        :attr:`replicas` copies each and the byte limits of ``scale`` (else the scale of
        ``GOODPUT_STORE_SCALE``, else the default: :mod:`goodput.bus.store_sizing`).

        Existing ones converge to the replica count (a server that joined a cluster takes its
        R1 streams to R3) and, when a scale was given here or in the environment, to its
        limits. A process told no scale leaves limits already set alone (a node agent started
        without the variable must not shrink the history the job was sized for) and only gives
        a stream without one (an older release's) the default's.

        Retried while JetStream is unavailable: a cluster that just started, or lost its meta
        leader, answers "unavailable" until its members elect one.
        """
        told = scale or scale_from_env()
        limits = store_limits(told or DEFAULT_SCALE)
        replicas = self.replicas
        for config in stream_configs(limits):
            stream = dataclasses.replace(config, num_replicas=replicas)
            await retry_transient(
                functools.partial(self._converge_stream, stream, enforce=told is not None),
                deadline_s=retry_for_s,
                what=f"create stream {config.name}",
            )
        for bucket in bucket_configs(limits):
            kv = dataclasses.replace(bucket, replicas=replicas)
            self._kv[bucket.bucket] = await retry_transient(
                functools.partial(self._converge_bucket, kv, enforce=told is not None),
                deadline_s=retry_for_s,
                what=f"create bucket {bucket.bucket}",
            )
        return limits

    async def _converge_stream(self, config: StreamConfig, *, enforce: bool) -> None:
        assert config.name is not None  # stream_configs names each stream
        current = await self._stream_config(config.name)
        if current is None:
            try:
                await self._stored_config(self.js.add_stream, config)
                return
            except nats.js.errors.BadRequestError as exc:
                raise_if_placement_pending(exc)
                # another process created it meanwhile, perhaps otherwise: converge to ours
                current = (await self.js.stream_info(config.name)).config
            except StoreTooSmallError:
                # added at the same moment by another process: its reservation left ours no room
                current = await self._stream_config(config.name)
                if current is None:
                    raise
        # An existing stream is updated, never added again: the server reserves the limit of
        # a stream "added" again on top of its own, and refuses it once the store is sized to
        # the sum. A limit a sizing process set is kept unless this one was told a scale.
        if not enforce and (current.max_bytes or -1) > 0:
            config = dataclasses.replace(config, max_bytes=current.max_bytes)
        await self._stored_config(self.js.update_stream, config)

    async def _converge_bucket(self, config: KeyValueConfig, *, enforce: bool) -> KeyValue:
        name = f"KV_{config.bucket}"
        stream = await self._stream_config(name)
        if stream is None:
            # created, or by another process meanwhile (perhaps otherwise): converged below
            try:
                await self.js.create_key_value(config)
            except nats.js.errors.BadRequestError as exc:
                raise_if_placement_pending(exc)  # else created meanwhile by another process
            except nats.js.errors.APIError as exc:
                # added at the same moment by another process (as for streams, above)
                if exc.err_code not in STORE_FULL_CODES or await self._stream_config(name) is None:
                    raise
            stream = (await self.js.stream_info(name)).config
        # change only the replica count, the limit and the discard policy, keep the rest
        keep_limit = not enforce and (stream.max_bytes or -1) > 0
        wanted = dataclasses.replace(
            stream,
            num_replicas=config.replicas,
            max_bytes=stream.max_bytes if keep_limit else config.max_bytes,
            discard=DiscardPolicy.OLD if config.bucket in OLDEST_DROPPED else stream.discard,
        )
        if wanted != stream:
            await self._stored_config(self.js.update_stream, wanted)
        return await self.js.key_value(config.bucket)

    async def _stream_config(self, name: str) -> StreamConfig | None:
        try:
            return (await self.js.stream_info(name)).config
        except nats.js.errors.NotFoundError:
            return None

    async def _stored_config(
        self, call: Callable[[StreamConfig], Awaitable[Any]], config: StreamConfig
    ) -> None:
        """``call(config)``; a server whose store cannot hold the limit says so in one line."""
        try:
            await call(config)
        except nats.js.errors.APIError as exc:
            raise_if_placement_pending(exc)
            if exc.err_code not in STORE_FULL_CODES:
                raise
            raise StoreTooSmallError(
                f"the NATS server cannot reserve {config.max_bytes} bytes for {config.name} "
                f"({exc.description}): raise its JetStream max_file_store to what `goodput "
                "bench store` prints for the scale, or lower GOODPUT_STORE_SCALE"
            ) from None

    async def kv(self, bucket: str) -> KeyValue:
        if bucket not in self._kv:
            self._kv[bucket] = await self.js.key_value(bucket)
        return self._kv[bucket]

    async def publish(
        self,
        subject: str,
        message: schemas.Message,
        *,
        msg_id: str,
        retry_for_s: float = 120.0,
        headers: dict[str, str] | None = None,
    ) -> PubAck:
        """Store ``message`` in JetStream exactly once, retrying through outages."""
        payload = schemas.encode(message)
        all_headers = inject_headers({**(headers or {}), "Nats-Msg-Id": msg_id})

        async def attempt() -> PubAck:
            return await self.js.publish(subject, payload, timeout=2.0, headers=all_headers)

        return await retry_transient(attempt, deadline_s=retry_for_s, what=f"publish {subject}")

    async def emit(self, event: schemas.Event, *, retry_for_s: float = 120.0) -> PubAck:
        """Publish a fact to its subject (``subjects.event_for``)."""
        return await self.publish(
            subjects.event_for(event), event, msg_id=schemas.new_id(), retry_for_s=retry_for_s
        )

    async def emit_many(self, events: Sequence[schemas.Event], *, window: int = 2000) -> int:
        """Publish many facts pipelined (acks awaited per window); stragglers retried one by one."""
        stored = 0
        for start in range(0, len(events), window):
            batch = [(event, schemas.new_id()) for event in events[start : start + window]]
            futures = [
                await self.js.publish_async(
                    subjects.event_for(event),
                    schemas.encode(event),
                    headers={"Nats-Msg-Id": msg_id},
                )
                for event, msg_id in batch
            ]
            outcomes = await asyncio.gather(*futures, return_exceptions=True)
            for (event, msg_id), outcome in zip(batch, outcomes, strict=True):
                if isinstance(outcome, BaseException):
                    await self.publish(subjects.event_for(event), event, msg_id=msg_id)
                stored += 1
        return stored

    async def send_command(
        self, target: str, command: schemas.Command, *, retry_for_s: float = 120.0
    ) -> PubAck:
        """Queue a command for ``target``; its id is the dedup id, so resending is harmless."""
        return await self.publish(
            subjects.command(command.job, target),
            command,
            msg_id=command.command_id,
            retry_for_s=retry_for_s,
        )

    async def publish_core(self, subject: str, message: schemas.Message) -> None:
        """Fire-and-forget core NATS (heartbeats): buffered by the client during a reconnect."""
        await self.nc.publish(subject, schemas.encode(message), headers=inject_headers())

    async def dead_letter(
        self,
        *,
        job: str,
        service: str,
        subject: str,
        reason: str,
        payload: bytes,
        stream_seq: int = 0,
        retry_for_s: float = 120.0,
    ) -> PubAck:
        """Store a dead letter no larger than the server accepts: the payload is cut to fit.

        A letter for a stored message has a deterministic id, so a message dead-lettered again
        after a lost ack is stored once.
        """
        letter = dead_letter_entry(
            job=job,
            service=service,
            subject=subject,
            reason=reason,
            payload=payload,
            stream_seq=stream_seq,
            max_payload=self.nc.max_payload,
        )
        # the subject's head names the stream, whose sequence names the message
        msg_id = f"{service}:{subject[:200]}:{stream_seq}" if stream_seq else schemas.new_id()
        return await self.publish(
            subjects.dead_letter(job, service), letter, msg_id=msg_id, retry_for_s=retry_for_s
        )

    async def close(self) -> None:
        if self.nc.is_closed:
            return
        self._closing.set()
        try:
            await self.nc.flush(timeout=2)
        except BUS_ERRORS:
            log.debug("flush before close failed; closing anyway")
        try:
            await self.nc.close()
        except ConnectionError:  # the server went first (a cancelled allocation): closed anyway
            log.debug("the connection was lost while closing")
