"""The health of a job's services, read from the bus alone: every replica's record.

Each service process keeps its own record in ``gp_services`` (``subjects.health_key``: the
job, the service, its node, its instance), so `goodput status` shows any stack, whoever
started it — `goodput up`, Kubernetes, Slurm — and two replicas of one service are two rows.
A replica whose record stopped being refreshed is *stale*: shown as such and unhealthy,
unless a replica of the same service (and node) started after that record's last refresh —
the process that replaced it — and then it is dropped. A record whose key does not match its
content (an older goodput's, or forged: anything on the bus may be) is ignored and counted.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec
import nats.errors
import nats.js.errors

from goodput import schemas, subjects
from goodput.bus import Bus
from goodput.bus.kv_scan import current_entries


class Slot(msgspec.Struct, frozen=True, kw_only=True):
    """A service of the stack: a central one (node "") or a per-node one."""

    service: str
    node: str = ""

    @property
    def name(self) -> str:
        return f"{self.service}@{self.node}" if self.node else self.service


class ServicesHealth(msgspec.Struct, kw_only=True):
    """One row per replica (and per expected service without one); healthy only if all are."""

    entries: list[dict]
    #: stale records of replicas that a newer replica of the same service replaced
    superseded: int = 0
    #: records under a key that does not match their content
    ignored: int = 0

    @property
    def healthy(self) -> bool:
        return all(entry["healthy"] for entry in self.entries)


def record_is_fresh(record: schemas.ServiceHealth, now_ns: int) -> bool:
    """A health record refreshed within a few of its periods: its service is still there."""
    return (now_ns - record.ts) / 1e9 < max(3 * record.period_s, 3.0)


async def read_records(bus: Bus, job: str) -> tuple[list[schemas.ServiceHealth], int]:
    """Every health record of ``job`` whose key matches its content, and how many did not."""
    try:
        entries = await current_entries(bus, subjects.SERVICES_BUCKET, subjects.health_keys_of(job))
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


def judge(
    records: Iterable[schemas.ServiceHealth],
    now_ns: int,
    *,
    expected: Iterable[Slot] = (),
    gone_pids: frozenset[int] = frozenset(),
) -> ServicesHealth:
    """The rows `goodput status` shows (pure). ``expected``: the services the caller knows the
    stack has (its record), each a row even without a record; ``gone_pids``: processes of that
    record known to have exited, whose fresh-looking records no longer count."""
    by_slot: dict[Slot, list[schemas.ServiceHealth]] = {slot: [] for slot in expected}
    for record in records:
        by_slot.setdefault(Slot(service=record.service, node=record.node), []).append(record)
    entries: list[dict] = []
    superseded = 0
    for slot, replicas in by_slot.items():
        if not replicas:
            entries.append(
                {
                    "name": slot.name,
                    "healthy": False,
                    "state": "missing",
                    "detail": "no health record",
                }
            )
            continue
        live_starts = [r.started_ts for r in replicas if _live(r, now_ns, gone_pids)]
        for record in sorted(replicas, key=lambda r: r.started_ts):
            live = _live(record, now_ns, gone_pids)
            if not live and any(start > record.ts for start in live_starts):
                superseded += 1
                continue
            entries.append(_entry(slot, record, live, now_ns, gone_pids))
    return ServicesHealth(entries=entries, superseded=superseded)


def _live(record: schemas.ServiceHealth, now_ns: int, gone_pids: frozenset[int]) -> bool:
    return record_is_fresh(record, now_ns) and record.pid not in gone_pids


def _entry(
    slot: Slot, record: schemas.ServiceHealth, live: bool, now_ns: int, gone: frozenset[int]
) -> dict:
    age_s = (now_ns - record.ts) / 1e9
    if live:
        state, detail = ("healthy" if record.healthy else "unhealthy"), record.detail
    elif record.pid in gone:
        state, detail = "stale", f"process {record.pid} is gone"
    else:
        last = f" (last: {record.detail})" if record.detail else ""
        state, detail = "stale", f"stale health record ({age_s:.0f} s old){last}"
    return {
        "name": slot.name,
        "healthy": state == "healthy",
        "state": state,
        "pid": record.pid,
        "instance": record.instance,
        "age_s": round(age_s, 2),
        "uptime_s": round((now_ns - record.started_ts) / 1e9, 1),
        "detail": detail,
    }


async def services_health(
    bus: Bus,
    job: str,
    now_ns: int,
    *,
    expected: Iterable[Slot] = (),
    gone_pids: frozenset[int] = frozenset(),
) -> ServicesHealth:
    """:func:`judge` over what the bus holds now."""
    records, ignored = await read_records(bus, job)
    report = judge(records, now_ns, expected=expected, gone_pids=gone_pids)
    report.ignored = ignored
    return report
