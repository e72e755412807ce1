"""Read every current entry of a KV bucket under a key filter, and know the read is complete.

nats-py's ``KeyValue.watch`` (and ``keys``, built on it) reports "caught up" before the first
entry when the push consumer's info says nothing is pending and no message has reached the
client yet. The server answers that info on another path than the one that delivers the
messages, so under load the answer can overtake messages already sent: the watcher then
reports an empty bucket. A replicator that read its index that way found "no complete
checkpoint in any tier" with three copies indexed, and a spare relaunched a job from step 0.

A pull consumer delivers nothing until asked, so the pending count returned when it is
created is exact, and every message says how many are still to come.
"""

from __future__ import annotations

import contextlib

import nats.errors
import nats.js.errors
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.kv import KV_DEL, KV_OP, KV_PURGE

from goodput.bus.client import Bus

#: at most this many entries per fetch (each fetch is one round trip)
BATCH = 512
#: the server drops the consumer this long after the last fetch, if the reader died first
INACTIVE_S = 10.0


async def current_entries(
    bus: Bus, bucket: str, keys: str = ">", timeout_s: float = 10.0
) -> dict[str, bytes]:
    """Key (without the bucket's prefix) -> value of every live entry matching ``keys``.

    Raises ``nats.errors.TimeoutError`` rather than return a partial view: a partial index
    could make a complete checkpoint look incomplete, or the reverse."""
    stream = f"KV_{bucket}"
    prefix = f"$KV.{bucket}."
    info = await bus.js.add_consumer(
        stream,
        ConsumerConfig(
            filter_subject=f"{prefix}{keys}",
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
            ack_policy=AckPolicy.NONE,
            inactive_threshold=INACTIVE_S,
            mem_storage=True,
            num_replicas=1,
        ),
    )
    entries: dict[str, bytes] = {}
    remaining = info.num_pending
    if not remaining:
        await _delete(bus, stream, info.name)
        return entries
    subscription = await bus.js.pull_subscribe_bind(stream=stream, name=info.name)
    try:
        while remaining:
            messages = await subscription.fetch(min(remaining, BATCH), timeout=timeout_s)
            for message in messages:
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
    return entries


async def _delete(bus: Bus, stream: str, consumer: str) -> None:
    """Free the consumer now; the inactivity threshold frees it if this fails."""
    with contextlib.suppress(nats.errors.Error, nats.js.errors.Error):
        await bus.js.delete_consumer(stream, consumer)
