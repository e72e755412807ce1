"""The health records services keep in ``gp_services``: read back, fresh or not, replaced.

Each service process writes its own record (``subjects.health_key``: job, service, node,
instance) every period. A record is *fresh* while refreshed within a few periods; one that
is not, and whose service (and node) has a fresh replica started after its last refresh, was
*replaced* (a restarted process): the new replica deletes it, and readers drop it. A record
whose key does not match its content (an older goodput's, or forged: anything on the bus may
be) is never used.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import nats.errors
import nats.js.errors

from goodput import schemas, subjects
from goodput.bus.client import Bus
from goodput.bus.kv_scan import current_entries


def record_is_fresh(record: schemas.ServiceHealth, now_ns: int) -> bool:
    """A health record refreshed within a few of its periods: its service is still there."""
    return (now_ns - record.ts) / 1e9 < max(3 * record.period_s, 3.0)


def replaced(record: schemas.ServiceHealth, live_starts: Iterable[int], now_ns: int) -> bool:
    """``record`` is stale and a live replica of its service started after its last refresh
    (``live_starts``: the start times of its service's fresh records)."""
    return not record_is_fresh(record, now_ns) and any(start > record.ts for start in live_starts)


async def read_records(
    bus: Bus, job: str, service: str = "", node: str = ""
) -> tuple[list[schemas.ServiceHealth], int]:
    """Every health record of ``job`` (of one ``service`` and ``node`` if named) whose key
    matches its content, and how many did not."""
    keys = subjects.health_keys_of(job, service, node)
    try:
        entries = await current_entries(bus, subjects.SERVICES_BUCKET, keys)
    except (nats.js.errors.NotFoundError, nats.errors.NoRespondersError):
        return [], 0  # a bus no service has provisioned yet
    records, ignored = [], 0
    for key, payload in entries.items():
        try:
            record = schemas.decode_event(payload)
        except schemas.SchemaError:
            record = None
        if (
            isinstance(record, schemas.ServiceHealth)
            and record.job == job
            and key == subjects.health_key(job, record.service, record.node, record.instance)
        ):
            records.append(record)
        else:
            ignored += 1
    return records, ignored


async def forget_replaced(bus: Bus, own: schemas.ServiceHealth, now_ns: int) -> int:
    """Delete the records of the replicas ``own`` (a fresh record, just written) replaced:
    their keys would otherwise pile up with every restart. How many were deleted."""
    records, _ = await read_records(bus, own.job, own.service, own.node)
    kv = await bus.kv(subjects.SERVICES_BUCKET)
    gone = 0
    for record in records:
        if record.instance != own.instance and replaced(record, [own.started_ts], now_ns):
            key = subjects.health_key(record.job, record.service, record.node, record.instance)
            with contextlib.suppress(nats.js.errors.Error, nats.errors.Error):
                await kv.delete(key)
                gone += 1
    return gone
