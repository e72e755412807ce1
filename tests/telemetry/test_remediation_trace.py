"""One remediation is one trace: sensor → controller → actuator → the relaunched rank's first step.

The sensor, controller and actuator services run in this process (their spans go to the
in-memory exporter) against a real nats-server; the actuator's local backend launches real
rank processes running the real trainer shim, which export their spans with the console
exporter chosen by ``OTEL_TRACES_EXPORTER`` into their log files. The first attempt's rank
saves a checkpoint and exits 1; the sensor calls it a crash, the controller decides an in-job
restart, the actuator relaunches, and the new rank restores and takes its first step.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import msgspec
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from goodput import schemas, subjects
from goodput.bus import Bus, BusSettings, EmbeddedNats
from goodput_services.actuator.service import ActuatorService
from goodput_services.controller.service import ControllerService
from goodput_services.replicator.service import ReplicatorService
from goodput_services.sensor.service import SensorService
from tests.stack.helpers import EventTap
from tests.telemetry.helpers import child_of, one, running, service_config

pytestmark = pytest.mark.slow
JOB = "job-trace"

# A rank under the real shim: attempt 1 trains two steps, saves, and crashes (exit 1);
# later attempts restore, train two steps and finish.
RANK_SCRIPT = """\
import os, sys
import torch
from goodput.shim import TrainerShim
from goodput.shim.link import wait_for_bus

shim = TrainerShim.from_env()
wait_for_bus(shim.link)
state = {"w": torch.zeros(4)}
restored = shim.restore(state)
first = restored.step + 1 if restored else 1
for step in range(first, first + 2):
    state["w"] += 1
    shim.step_done(step, 0.01, tokens=8, loss=1.0)
    if shim.should_checkpoint(step):
        shim.save(state, step)
shim.finish(state, step)
sys.exit(1 if os.environ["GOODPUT_ATTEMPT"] == "1" else 0)
"""


def console_spans(log: Path) -> list[dict]:
    """The spans a process printed with the console exporter (pretty JSON objects)."""
    text = "\n" + log.read_text(errors="replace")
    decoder = json.JSONDecoder()
    found, offset = [], 0
    while (start := text.find("\n{\n", offset)) >= 0:
        try:
            value, end = decoder.raw_decode(text, start + 1)
        except json.JSONDecodeError:
            offset = start + 1
            continue
        if isinstance(value, dict) and "context" in value:
            found.append(value)
        offset = end
    return found


def hex_id(value: int, digits: int) -> str:
    return f"0x{value:0{digits}x}"


async def test_a_remediation_is_one_trace_from_signal_to_first_step(
    tmp_path: Path, nats_server: EmbeddedNats, spans: InMemorySpanExporter
) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)

    state = tmp_path / "state"
    sensor = SensorService(service_config(JOB, nats_server, state))
    controller = ControllerService(service_config(JOB, nats_server, state))
    # before relaunching, the actuator asks the node's replicator to fill its volume
    actuator = ActuatorService(service_config(JOB, nats_server, state, restore_timeout_s=30))
    replicator = ReplicatorService(
        msgspec.structs.replace(service_config(JOB, nats_server, state), node="node-0")
    )
    bus = await Bus.connect(BusSettings(url=nats_server.url), name="test")
    await bus.provision()
    tap = await EventTap(bus, JOB).start()
    try:
        async with running(sensor, controller, actuator, replicator):
            start = schemas.StartJob(
                job=JOB,
                argv=[sys.executable, str(script)],
                nodes=1,
                procs_per_node=1,
                env={"GOODPUT_CKPT_EVERY": "2", "OTEL_TRACES_EXPORTER": "console"},
            )
            await bus.send_command(subjects.ACTUATOR, start)
            signal = await tap.wait_for(
                lambda e: isinstance(e, schemas.Signal) and e.signal == "crash", timeout_s=120
            )
            await tap.wait_for(
                lambda e: isinstance(e, schemas.JobStatus) and e.state == "finished",
                timeout_s=120,
                what="the relaunched rank finishing",
            )
            # the replicator checks the volume before the launch (rank -1), the rank loads it
            restored = tap.of(schemas.CheckpointRestored)
            assert [e.step for e in restored if e.rank >= 0] == [2]
    finally:
        await tap.stop()
        await bus.close()

    finished = list(spans.get_finished_spans())
    root = one(finished, "signal crash", **{"goodput.signal_id": signal.signal_id})
    assert root.parent is None, "the signal starts the remediation's trace"
    trace_id = root.context.trace_id
    in_trace = [s for s in finished if s.context.trace_id == trace_id]

    # controller: consumes the signal (context from the headers), decides, sends the command
    handled = one(in_trace, "controller handle Signal")
    decided = one(in_trace, "controller decide crash")
    sent = one(in_trace, "controller send restart")
    assert child_of(handled, root) and child_of(decided, handled) and child_of(sent, decided)
    assert decided.attributes["goodput.rule"] == "in-job-restart"
    # actuator: consumes the command, executes it, stops and relaunches the ranks
    executed = one(in_trace, "actuator execute restart")
    launched = one(in_trace, "actuator launch ranks")
    assert child_of(one(in_trace, "actuator handle Restart"), sent)
    assert child_of(executed, one(in_trace, "actuator handle Restart"))
    assert child_of(launched, executed) and launched.attributes["goodput.attempt"] == 2
    assert child_of(one(in_trace, "actuator stop ranks"), executed)
    # replicator: the pre-launch restore of node-0's volume belongs to the same remediation
    restore = one(in_trace, "replicator execute restore_to_node")
    assert restore.parent is not None
    assert {s.name for s in in_trace if s.name.startswith("replicator")} >= {
        "replicator handle RestoreToNode",
        "replicator execute restore_to_node",
    }

    # the relaunched rank (another process): restore and first step, under the launch span
    log = state / "logs" / "ranks" / "attempt-002" / "node-0-rank0.log"
    rank_spans = [s for s in console_spans(log) if s["name"] == "trainer restore and first step"]
    assert len(rank_spans) == 1, log.read_text()[-3000:]
    resumed = rank_spans[0]
    assert resumed["context"]["trace_id"] == hex_id(trace_id, 32)
    assert resumed["parent_id"] == hex_id(launched.context.span_id, 16)
    assert resumed["resource"]["attributes"]["service.name"] == "goodput-trainer"
    assert resumed["attributes"]["goodput.restored_step"] == 2
    assert resumed["attributes"]["goodput.first_step"] == 3
    # ...and its first StepDone carried the trace back: the controller consumed it in it
    first_step = [
        s
        for s in in_trace
        if s.name == "controller handle StepDone"
        and s.parent is not None
        and hex_id(s.parent.span_id, 16) == resumed["context"]["span_id"]
    ]
    assert len(first_step) == 1

    # the first attempt's crash is not part of its launch's trace
    start_trace = one(finished, "actuator execute start_job").context.trace_id
    assert start_trace != trace_id
