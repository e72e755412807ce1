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
"""

from __future__ import annotations

import asyncio
import contextlib
import time

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
    deadline = time.monotonic() + timeout_s
    prefix = f"$KV.{bucket}."
    while True:
        try:
            mark = await bus.js.publish(f"{prefix}{READ_MARK_KEY}", b"1", timeout=timeout_s)
        except nats.js.errors.NoStreamResponseError:
            await bus.js.stream_info(f"KV_{bucket}")  # NotFoundError where there is no bucket
            raise
        entries, mark_seen = await _read(bus, bucket, keys, mark.seq, timeout_s)
        if mark_seen:
            return entries
        if time.monotonic() + STALE_RETRY_S > deadline:
            raise StaleReadError
        await asyncio.sleep(STALE_RETRY_S)


async def _read(
    bus: Bus, bucket: str, keys: str, mark_seq: int, timeout_s: float
) -> tuple[dict[str, bytes], bool]:
    """One pass: the entries, and whether the store held the mark at ``mark_seq`` or later."""
    stream = f"KV_{bucket}"
    prefix = f"$KV.{bucket}."
    wanted = f"{prefix}{keys}"
    mark = f"{prefix}{READ_MARK_KEY}"
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
    entries: dict[str, bytes] = {}
    mark_seen = False
    remaining = info.num_pending
    if not remaining:
        await _delete(bus, stream, info.name)
        return entries, mark_seen
    subscription = await bus.js.pull_subscribe_bind(stream=stream, name=info.name)
    try:
        while remaining:
            messages = await subscription.fetch(min(remaining, BATCH), timeout=timeout_s)
            for message in messages:
                if message.subject == mark:
                    mark_seen = mark_seen or message.metadata.sequence.stream >= mark_seq
                    continue
                key = message.subject[len(prefix) :]
                operation = (message.headers or {}).get(KV_OP)
                if operation in (KV_DEL, KV_PURGE) or not message.data:
                    entries.pop(key, None)
                else:
                    entries[key] = message.data
            remaining = messages[-1].metadata.num_pending
    finally:
        with contextlib.suppress(nats.errors.Error):
            await subscription.unsubscribe()
        await _delete(bus, stream, info.name)
    return entries, mark_seen


def subject_matches(pattern: str, subject: str) -> bool:
    """Whether NATS delivers ``subject`` to a filter ``pattern`` ('*' one token, '>' the rest)."""
    tokens = subject.split(".")
    for i, token in enumerate(pattern.split(".")):
        if token == ">":
            return len(tokens) > i
        if i >= len(tokens) or token not in ("*", tokens[i]):
            return False
    return len(pattern.split(".")) == len(tokens)


async def _delete(bus: Bus, stream: str, consumer: str) -> None:
    """Free the consumer now; the inactivity threshold frees it if this fails."""
    with contextlib.suppress(nats.errors.Error, nats.js.errors.Error):
        await bus.js.delete_consumer(stream, consumer)
