"""Service health from the bus alone: one record per replica, judged (stale, replaced,
missing, gone), and records that do not match their key ignored."""

from __future__ import annotations

import asyncio
import time

import msgspec

from goodput import schemas, subjects
from goodput.bus import Bus
from goodput.config import ServiceConfig
from goodput.tools.stack.health import Slot, judge, read_records
from goodput_services.base import Service
from tests.telemetry.helpers import running

JOB = "job-health"
S = 1_000_000_000
NOW = 1_800_000_000 * S


def _record(service: str, instance: str, *, started_s: float, seen_s: float, **fields):
    return schemas.ServiceHealth(
        job=JOB,
        service=service,
        instance=instance,
        pid=fields.pop("pid", 100),
        healthy=fields.pop("healthy", True),
        started_ts=NOW - int(started_s * S),
        ts=NOW - int(seen_s * S),
        **fields,
    )


def test_two_live_replicas_are_two_rows() -> None:
    report = judge(
        [
            _record("controller", "a", started_s=60, seen_s=0.5, detail="leader"),
            _record("controller", "b", started_s=50, seen_s=0.2, detail="standby"),
        ],
        NOW,
    )
    assert [(e["instance"], e["state"]) for e in report.entries] == [
        ("a", "healthy"),
        ("b", "healthy"),
    ]
    assert report.healthy


def test_a_replaced_replica_is_dropped_a_lost_one_is_stale() -> None:
    restarted = [
        _record("sensor", "old", started_s=300, seen_s=120),  # died 2 min ago
        _record("sensor", "new", started_s=100, seen_s=0.5),  # started after: replaced it
    ]
    report = judge(restarted, NOW)
    assert [e["instance"] for e in report.entries] == ["new"] and report.superseded == 1
    assert report.healthy
    # one of two replicas died after the other started: nothing replaced it
    lost = [
        _record("controller", "a", started_s=300, seen_s=120, detail="leader"),
        _record("controller", "b", started_s=290, seen_s=0.5),
    ]
    report = judge(lost, NOW)
    stale = next(e for e in report.entries if e["instance"] == "a")
    assert stale["state"] == "stale" and "120 s old" in stale["detail"]
    assert "last: leader" in stale["detail"] and not report.healthy


def test_expected_services_without_a_record_and_exited_processes_are_unhealthy() -> None:
    records = [_record("hostmon", "h", started_s=10, seen_s=0.1, node="node-0", pid=7)]
    report = judge(
        records,
        NOW,
        expected=[Slot(service="actuator"), Slot(service="hostmon", node="node-0")],
        gone_pids=frozenset({7}),
    )
    rows = {e["name"]: e for e in report.entries}
    assert rows["actuator"]["state"] == "missing"
    assert rows["hostmon@node-0"]["state"] == "stale"
    assert rows["hostmon@node-0"]["detail"] == "process 7 is gone"
    assert not report.healthy


def test_an_unhealthy_replica_makes_the_report_unhealthy() -> None:
    record = _record("replicator", "r", started_s=9, seen_s=0.1, healthy=False, detail="disk")
    (entry,) = judge([record], NOW).entries
    assert (entry["state"], entry["detail"], entry["healthy"]) == ("unhealthy", "disk", False)


async def test_records_whose_key_and_content_disagree_are_ignored(bus: Bus) -> None:
    kv = await bus.kv(subjects.SERVICES_BUCKET)
    good = _record("sensor", "host.example-1", started_s=5, seen_s=0, node="")
    await kv.put(subjects.health_key(JOB, "sensor", "", good.instance), schemas.encode(good))
    # a record claiming to be the actuator, under the sensor's key: forged or corrupt
    forged = _record("actuator", "x", started_s=5, seen_s=0)
    await kv.put(subjects.health_key(JOB, "sensor", "", "x"), schemas.encode(forged))
    await kv.put(subjects.health_key(JOB, "sensor", "", "junk"), b"\x93not a record")
    other_job = msgspec.structs.replace(_record("sensor", "y", started_s=5, seen_s=0), job="b")
    await kv.put(subjects.health_key(JOB, "sensor", "", "y"), schemas.encode(other_job))
    await kv.put(subjects.health_key("b", "sensor", "", "y"), schemas.encode(other_job))
    records, ignored = await read_records(bus, JOB)
    assert [r.instance for r in records] == ["host.example-1"] and ignored == 3


class _Probe(Service):
    """The smallest service: the base's health loop and nothing else."""

    name = "controller"


async def test_each_replica_of_a_service_keeps_its_own_record(bus: Bus, nats_server) -> None:
    replicas = [
        _Probe(ServiceConfig(job=JOB, instance=name, bus=bus.settings)) for name in ("a", "b")
    ]
    async with running(*replicas):
        for _ in range(100):
            records, _ = await read_records(bus, JOB)
            if len(records) == 2:
                break
            await asyncio.sleep(0.1)
    assert sorted(r.instance for r in records) == ["a", "b"]
    report = judge(records, time.time_ns())
    assert [e["name"] for e in report.entries] == ["controller", "controller"]
