"""The health of a job's services as `goodput status` shows it: every replica's record
(:mod:`goodput.bus.service_health`), judged.

The records come from the bus alone, so any stack shows, whoever started it — `goodput up`,
Kubernetes, Slurm — and two replicas of one service are two rows. A replica whose record
stopped being refreshed is *stale*: shown as such and unhealthy, unless a newer replica of
the same service (and node) replaced it, and then it is dropped. Records whose key does not
match their content are ignored and counted.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from goodput import schemas
from goodput.bus import Bus
from goodput.bus.service_health import read_records, record_is_fresh, replaced


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
    #: stale records of replicas a newer replica of the same service replaced (and has not
    #: deleted yet)
    superseded: int = 0
    #: records under a key that does not match their content
    ignored: int = 0

    @property
    def healthy(self) -> bool:
        return all(entry["healthy"] for entry in self.entries)


def judge(
    records: Iterable[schemas.ServiceHealth],
    now_ns: int,
    *,
    expected: Iterable[Slot] = (),
    running_pids: frozenset[int] | None = None,
) -> ServicesHealth:
    """The rows `goodput status` shows (pure). ``expected``: the services the caller knows the
    stack has (its record), each a row even without a record; ``running_pids``: where given, the
    processes that run those services now — a record of theirs from any other pid was written by
    a process that has exited, and its fresh look no longer counts."""
    by_slot: dict[Slot, list[schemas.ServiceHealth]] = {slot: [] for slot in expected}
    known = set(by_slot)  # the pids of the caller's record say nothing of other processes
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
        running = running_pids if slot in known else None
        live_starts = [r.started_ts for r in replicas if _live(r, now_ns, running)]
        for record in sorted(replicas, key=lambda r: r.started_ts):
            live = _live(record, now_ns, running)
            if not live and replaced(record, live_starts, now_ns):
                superseded += 1
                continue
            entries.append(_entry(slot, record, live, now_ns, running))
    return ServicesHealth(entries=entries, superseded=superseded)


def _live(record: schemas.ServiceHealth, now_ns: int, running: frozenset[int] | None) -> bool:
    return record_is_fresh(record, now_ns) and (running is None or record.pid in running)


def _entry(
    slot: Slot,
    record: schemas.ServiceHealth,
    live: bool,
    now_ns: int,
    running: frozenset[int] | None,
) -> dict:
    age_s = (now_ns - record.ts) / 1e9
    if live:
        state, detail = ("healthy" if record.healthy else "unhealthy"), record.detail
    elif running is not None and record.pid not in running:
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
    running_pids: frozenset[int] | None = None,
) -> ServicesHealth:
    """:func:`judge` over what the bus holds now."""
    records, ignored = await read_records(bus, job)
    report = judge(records, now_ns, expected=expected, running_pids=running_pids)
    report.ignored = ignored
    return report
