"""Read every current entry of a KV bucket under a key filter, and know the read is complete
and current.

nats-py's ``KeyValue.watch`` (and ``keys``, built on it) reports "caught up" before the first
entry when the push consumer's info says nothing is pending and no message has reached the
client yet. The server answers that info on another path than the one that delivers the
messages, so under load the answer can overtake messages already sent: the watcher then
reports an empty bucket. A replicator that read its index that way found "no complete
checkpoint in any tier" with three copies indexed, and a spare relaunched a job from step 0.

A pull consumer delivers nothing until asked, so the pending count returned when it is
created is exact, and every message says how many are still to come.

Complete is not current: on a cluster, the store a consumer reads can be behind the stream's
log. Just after its leader was killed, a bucket's new leader served a read without the last
delete its predecessor had acknowledged (a deleted copy read as live). So each read first
writes a mark and must see it: the store applies the log in order, so a store holding the
mark holds every write acknowledged before it; one that does not is read again.

A read can stay open (:func:`open_read`, :class:`LiveRead`): after the entries pending at
its creation, the same consumer delivers every later change in the log's order, each
message numbered by the consumer, so a gap or a lost consumer (server restart, inactivity
threshold) is seen, never silently skipped (``checkpoint.index.follower`` follows the index
so).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import nats.errors
import nats.js.errors
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.kv import KV_DEL, KV_OP, KV_PURGE

from goodput.bus.client import Bus

#: at most this many entries per fetch (each fetch is one round trip)
BATCH = 512
#: the server drops the consumer this long after the last fetch, if the reader died first
INACTIVE_S = 10.0
#: the key each read writes and must see; '=' is in no name token, so no job's keys hold it
READ_MARK_KEY = "=goodput.read-mark"
#: a store behind its log catches up within milliseconds: read again this soon
STALE_RETRY_S = 0.05


class StaleReadError(nats.errors.TimeoutError):
    """Every read within the time came from a store behind the bucket's log."""

    def __str__(self) -> str:
        return "nats: the bucket's store stayed behind its log (a new leader catching up)"


async def current_entries(
    bus: Bus, bucket: str, keys: str = ">", timeout_s: float = 10.0
) -> dict[str, bytes]:
    """Key (without the bucket's prefix) -> value of every live entry matching ``keys``, with
    every write acknowledged before the call.

    Raises ``nats.errors.TimeoutError`` rather than return a partial or stale view: a
    partial index could make a complete checkpoint look incomplete, or the reverse."""
    read = await open_read(bus, bucket, keys, timeout_s)
    await read.close()
    return read.entries


async def open_read(bus: Bus, bucket: str, keys: str = ">", timeout_s: float = 10.0) -> LiveRead:
    """A complete, current read (as :func:`current_entries`) whose consumer stays open, so
    that what it fetches next are the changes after the read: close it when done."""
    deadline = time.monotonic() + timeout_s
    while True:
        mark_seq = await write_mark(bus, bucket, timeout_s)
        read = await _open(bus, bucket, keys, timeout_s)
        try:
            mark_seen = await read.drain(mark_seq, timeout_s)
        except BaseException:
            await read.close()
            raise
        if mark_seen:
            return read
        await read.close()
        if time.monotonic() + STALE_RETRY_S > deadline:
            raise StaleReadError
        await asyncio.sleep(STALE_RETRY_S)


async def write_mark(bus: Bus, bucket: str, timeout_s: float = 10.0) -> int:
    """Write the read mark; its stream sequence. A reader that has seen a message at or past
    it has seen every write acknowledged before this call."""
    try:
        ack = await bus.js.publish(kv_subject(bucket, READ_MARK_KEY), b"1", timeout=timeout_s)
    except nats.js.errors.NoStreamResponseError:
        await bus.js.stream_info(f"KV_{bucket}")  # NotFoundError where there is no bucket
        raise
    return ack.seq


class Change(NamedTuple):
    """One message of the bucket's log as a reader sees it."""

    #: the key without the bucket's prefix (:data:`READ_MARK_KEY` for a mark)
    key: str
    #: the new value; None: the key was deleted or purged
    value: bytes | None
    #: its stream sequence
    seq: int

    @property
    def is_mark(self) -> bool:
        return self.key == READ_MARK_KEY


class ReadLost(nats.errors.Error):
    """The consumer behind a :class:`LiveRead` is gone or skipped messages: read again."""


@dataclass
class LiveRead:
    """An ephemeral pull consumer on the bucket's log (deliver last per subject, then every
    change), with the entries it delivered so far."""

    bus: Bus
    stream: str
    consumer: str
    prefix: str
    #: the pending count when it was created: exact, as nothing is delivered unasked
    initial: int
    subscription: Any = None
    entries: dict[str, bytes] = field(default_factory=dict)
    #: stream sequence of the newest message delivered, its consumer sequence, and how many
    #: messages the consumer held after it
    seq: int = 0
    delivered: int = 0
    pending: int = 0

    async def drain(self, mark_seq: int, timeout_s: float) -> bool:
        """Fetch the entries pending at creation into :attr:`entries`; whether the store
        held the mark at ``mark_seq`` or later."""
        mark_seen = False
        self.pending = self.initial
        while self.pending:
            for change in await self._fetch(min(self.pending, BATCH), timeout_s):
                if change.is_mark:
                    mark_seen = mark_seen or change.seq >= mark_seq
                elif change.value is None:
                    self.entries.pop(change.key, None)
                else:
                    self.entries[change.key] = change.value
        return mark_seen

    async def changes(self, wait_s: float) -> list[Change]:
        """The next changes after those already fetched, in the log's order: a batch of
        those pending, else the first to come within ``wait_s``. Empty if none came while
        the consumer is alive; raises :class:`ReadLost` if it is gone or skipped messages."""
        if self.pending:
            return await self._fetch(min(self.pending, BATCH), wait_s)
        try:
            return await self._fetch(1, wait_s, heartbeat_s=wait_s / 3)
        except nats.js.errors.FetchTimeoutError:
            return []  # the server sent heartbeats: the consumer is alive, nothing changed
        except nats.errors.TimeoutError:
            if not await self._alive():
                raise ReadLost(f"consumer {self.consumer} is gone") from None
            return []
        except nats.js.errors.APIError as exc:  # e.g. 409: the consumer was deleted
            raise ReadLost(f"consumer {self.consumer}: {exc}") from None

    async def _fetch(
        self, count: int, timeout_s: float, heartbeat_s: float | None = None
    ) -> list[Change]:
        """Up to ``count`` messages as changes (:attr:`pending`: how many are left)."""
        if self.subscription is None:
            self.subscription = await self.bus.js.pull_subscribe_bind(
                stream=self.stream, name=self.consumer
            )
        messages = await self.subscription.fetch(count, timeout=timeout_s, heartbeat=heartbeat_s)
        changes = []
        for message in messages:
            sequence = message.metadata.sequence
            if sequence.consumer != self.delivered + 1:
                raise ReadLost(
                    f"consumer {self.consumer} delivered #{sequence.consumer} after "
                    f"#{self.delivered}"
                )
            self.delivered = sequence.consumer
            self.seq = max(self.seq, sequence.stream)
            operation = (message.headers or {}).get(KV_OP)
            deleted = operation in (KV_DEL, KV_PURGE) or not message.data
            key = message.subject[len(self.prefix) :]
            changes.append(Change(key, None if deleted else message.data, sequence.stream))
        self.pending = messages[-1].metadata.num_pending
        return changes

    async def _alive(self) -> bool:
        try:
            await self.bus.js.consumer_info(self.stream, self.consumer)
        except nats.js.errors.NotFoundError:
            return False
        except nats.errors.Error as exc:  # no server to ask (restarting): read again then
            raise ReadLost(f"consumer {self.consumer}: {exc!r}") from None
        return True

    async def close(self) -> None:
        """Free the consumer now; the inactivity threshold frees it if this fails."""
        if self.subscription is not None:
            with contextlib.suppress(nats.errors.Error):
                await self.subscription.unsubscribe()
        with contextlib.suppress(nats.errors.Error, nats.js.errors.Error):
            await self.bus.js.delete_consumer(self.stream, self.consumer)


async def _open(bus: Bus, bucket: str, keys: str, timeout_s: float) -> LiveRead:
    """A new consumer of the entries matching ``keys`` and the mark, not fetched from yet."""
    stream = f"KV_{bucket}"
    prefix = kv_subject(bucket, "")
    wanted = kv_subject(bucket, keys)
    mark = kv_subject(bucket, READ_MARK_KEY)
    # overlapping filters are refused: a filter that takes in the mark reads it already
    filters = [wanted] if subject_matches(wanted, mark) else [wanted, mark]
    info = await bus.js.add_consumer(
        stream,
        ConsumerConfig(
            filter_subjects=filters,
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
            ack_policy=AckPolicy.NONE,
            inactive_threshold=INACTIVE_S,
            mem_storage=True,
            num_replicas=1,
        ),
    )
    # a server that leaves the count out (None) has nothing pending for this read either
    return LiveRead(bus, stream, info.name, prefix, info.num_pending or 0)


def kv_subject(bucket: str, key: str) -> str:
    """The subject a bucket's entry (or a filter of keys) is written and read on."""
    return f"$KV.{bucket}.{key}"


def subject_matches(pattern: str, subject: str) -> bool:
    """Whether NATS delivers ``subject`` to a filter ``pattern`` ('*' one token, '>' the rest)."""
    tokens = subject.split(".")
    for i, token in enumerate(pattern.split(".")):
        if token == ">":
            return len(tokens) > i
        if i >= len(tokens) or token not in ("*", tokens[i]):
            return False
    return len(pattern.split(".")) == len(tokens)
