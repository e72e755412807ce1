"""A command a dead leader stored but never sent is resent by the standby in the same trace.

Two controller services run in this process against a real nats-server. The first decides
about a signal, stores the decision and its command in the outbox, and is stopped while
holding it (fault injection: a pause between storing and sending). The second takes over and
sends the stored command: its send span and the command's ``traceparent`` header belong to
the signal's trace, as children of the first leader's decision span.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgspec
from nats.js.api import ConsumerConfig, DeliverPolicy
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from goodput import schemas, subjects
from goodput.bus import Bus, BusSettings, EmbeddedNats
from goodput.telemetry import TRACEPARENT, tracer
from goodput_services.controller.service import ControllerRecord, ControllerService
from tests.telemetry.helpers import child_of, one, running, service_config

JOB = "job-outbox"


async def until(predicate, timeout_s: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"no {what} within {timeout_s} s"
        await asyncio.sleep(0.05)


async def stored_record(bus: Bus) -> ControllerRecord:
    kv = await bus.kv(subjects.STATE_BUCKET)
    entry = await kv.get(subjects.kv_key(JOB, "controller"))
    return msgspec.msgpack.decode(entry.value or b"", type=ControllerRecord)


async def test_the_standby_resends_a_stored_command_in_the_signals_trace(
    tmp_path: Path, nats_server: EmbeddedNats, spans: InMemorySpanExporter
) -> None:
    doomed = ControllerService(
        service_config(JOB, nats_server, tmp_path, inject_pause_before_send_s=30.0, lease_ttl_s=1.0)
    )
    standby = ControllerService(service_config(JOB, nats_server, tmp_path, lease_ttl_s=1.0))
    bus = await Bus.connect(BusSettings(url=nats_server.url), name="test")
    await bus.provision()
    try:
        async with running(doomed) as (doomed_task,):
            await until(lambda: doomed.leading, what="leader")
            await bus.emit(
                schemas.JobStatus(
                    job=JOB,
                    state="running",
                    attempt=1,
                    world_size=2,
                    procs_per_node=1,
                    active_nodes=["n0", "n1"],
                )
            )
            await until(lambda: doomed.record.state is not None, what="job state")
            # the test stands in for the sensor: the signal is sent inside a root span
            signal = schemas.Signal(job=JOB, signal="crash", node="n1", detail="exit 1")
            with tracer("goodput.test").start_as_current_span("signal crash") as root:
                await bus.emit(signal)
            await until(lambda: bool(doomed.record.outbox), what="a stored command")
            stored = await stored_record(bus)
            assert stored.outbox and all(c.command_id in stored.traces for c in stored.outbox)
            doomed.request_stop()
            await asyncio.wait_for(doomed_task, 60)
        assert not doomed.decisions, "the first leader must not have sent anything"

        async with running(standby):
            await until(lambda: standby.decisions > 0, what="the standby's resend")
            commands = await bus.js.pull_subscribe(
                subjects.command(JOB, subjects.ACTUATOR),
                stream=subjects.COMMANDS_STREAM,
                config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
            )
            (message,) = await commands.fetch(1, timeout=10)
        assert not (await stored_record(bus)).traces, "sent: nothing left to remember"
    finally:
        await bus.close()

    trace_id = root.get_span_context().trace_id
    header = (message.headers or {})[TRACEPARENT]
    assert header.split("-")[1] == f"{trace_id:032x}"
    finished = [s for s in spans.get_finished_spans() if s.context.trace_id == trace_id]
    decided = one(finished, "controller decide crash")
    sent = one(finished, "controller send restart_in_process")  # by the standby, not the doomed
    assert child_of(sent, decided)
    assert header.split("-")[2] == f"{sent.context.span_id:016x}"
