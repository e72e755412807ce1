"""One active controller at a time: a lease in the ``gp_leases`` KV bucket.

The holder renews it every ``ttl_s / 3``; a standby takes it over once it has expired. Every
write is a compare-and-set on the key's revision, so two instances can never both believe
they hold it after the same write.
"""

from __future__ import annotations

import contextlib

import msgspec
import nats.js.errors

from goodput import subjects
from goodput.bus import Bus


class LeaseRecord(msgspec.Struct, kw_only=True):
    holder: str
    expires_ns: int


class Lease:
    def __init__(self, bus: Bus, job: str, name: str, holder: str, ttl_s: float):
        self.bus = bus
        self.key = subjects.kv_key(job, name)
        self.holder = holder
        self.ttl_ns = int(ttl_s * 1e9)

    async def acquire_or_renew(self, now_ns: int) -> bool:
        """True if this instance holds the lease after the call."""
        kv = await self.bus.kv(subjects.LEASES_BUCKET)
        record = LeaseRecord(holder=self.holder, expires_ns=now_ns + self.ttl_ns)
        payload = msgspec.msgpack.encode(record)
        try:
            entry = await kv.get(self.key)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            try:
                await kv.create(self.key, payload)
            except nats.js.errors.KeyWrongLastSequenceError:
                return False
            return True
        current = msgspec.msgpack.decode(entry.value or b"", type=LeaseRecord)
        if current.holder != self.holder and current.expires_ns > now_ns:
            return False
        try:
            await kv.update(self.key, payload, last=entry.revision)
        except nats.js.errors.KeyWrongLastSequenceError:
            return False
        return True

    async def release(self) -> None:
        """Give the lease up at once (a clean shutdown), so the standby needn't wait it out."""
        kv = await self.bus.kv(subjects.LEASES_BUCKET)
        try:
            entry = await kv.get(self.key)
        except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
            return
        current = msgspec.msgpack.decode(entry.value or b"", type=LeaseRecord)
        if current.holder == self.holder:
            expired = msgspec.msgpack.encode(LeaseRecord(holder=self.holder, expires_ns=0))
            with contextlib.suppress(nats.js.errors.KeyWrongLastSequenceError):
                await kv.update(self.key, expired, last=entry.revision)
