"""A real actuator refuses the controller's hot swap: the controller sees the node still active.

Real nats-server, real actuator and controller processes, real (sleeping) rank processes. The
spare is taken by an operator's hot swap sent straight to the actuator just before a fault;
the actuator holds that swap for its pre-launch restore (no checkpoint tier answers), so the
controller decides on the fault while the spare still looks free, and the actuator, executing
in order, must refuse the controller's swap.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import msgspec
import pytest

from goodput import schemas, subjects
from goodput.bus import Bus, BusSettings, EmbeddedNats
from goodput.supervisor.jobstate.model import JobState
from tests.controller.helpers import spawn_service
from tests.processes import stop
from tests.stack.helpers import EventTap

pytestmark = pytest.mark.slow
JOB = "job-refusal"
SLEEPER = "import time; time.sleep(600)"


class _Record(msgspec.Struct):
    state: JobState | None = None


async def _controller_state(bus: Bus) -> JobState | None:
    kv = await bus.kv(subjects.STATE_BUCKET)
    try:
        entry = await kv.get(subjects.kv_key(JOB, "controller"))
    except Exception:
        return None
    return msgspec.msgpack.decode(entry.value or b"", type=_Record).state


async def _wait_state(bus: Bus, predicate, what: str) -> JobState:
    deadline = time.monotonic() + 60
    while (state := await _controller_state(bus)) is None or not predicate(state):
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        await asyncio.sleep(0.2)
    return state


async def test_a_refused_hot_swap_leaves_the_node_active_for_the_next_decision(
    tmp_path: Path, nats_server: EmbeddedNats
) -> None:
    processes = [
        spawn_service("actuator", JOB, nats_server, tmp_path, "restore_timeout_s=4"),
        spawn_service("controller", JOB, nats_server, tmp_path),
    ]
    bus = await Bus.connect(BusSettings(url=nats_server.url), name="test")
    await bus.provision()
    tap = await EventTap(bus, JOB).start()
    try:
        start = schemas.StartJob(
            job=JOB, argv=[sys.executable, "-c", SLEEPER], nodes=2, procs_per_node=1, spares=1
        )
        await bus.send_command(subjects.ACTUATOR, start)
        await tap.wait_for(
            lambda e: isinstance(e, schemas.JobStatus) and e.state == "running", timeout_s=60
        )
        await _wait_state(bus, lambda s: s.spares == ["node-2"], "the controller took up the job")

        operator = schemas.HotSwap(job=JOB, failed_node="node-1", spare_node="node-2")
        await bus.send_command(subjects.ACTUATOR, operator)
        fault = schemas.Signal(
            job=JOB,
            signal="degraded_host",
            node="node-0",
            severity="uncorrectable",
            detail="gpu0 xid 79",
            observed_ts=time.time_ns(),
        )
        await bus.emit(fault)

        first = await tap.wait_for(
            lambda e: isinstance(e, schemas.Decision) and e.signal_id == fault.signal_id,
            timeout_s=30,
        )
        assert first.rule == "hot-swap"
        refused = await tap.wait_for(
            lambda e: isinstance(e, schemas.ActionResult) and e.command_id == first.command_ids[0],
            timeout_s=60,
        )
        assert not refused.ok and "node-2" in refused.detail
        # decided again on what the actuator reported: node-0 is still active, no spare is left
        second = await tap.wait_for(
            lambda e: (
                isinstance(e, schemas.Decision)
                and e.signal_id == fault.signal_id
                and e.decision_id != first.decision_id
            ),
            timeout_s=30,
        )
        assert second.rule == "scale-down" and "refused" in second.reason
        scaled = await tap.wait_for(
            lambda e: isinstance(e, schemas.ActionResult) and e.command_id == second.command_ids[0],
            timeout_s=60,
        )
        assert scaled.ok, scaled.detail
        status = await tap.wait_for(
            lambda e: isinstance(e, schemas.JobStatus) and e.attempt == 3 and e.state == "running",
            timeout_s=60,
        )
        assert status.active_nodes == ["node-2"]
        assert sorted(status.failed_nodes) == ["node-0", "node-1"]
        state = await _wait_state(bus, lambda s: not s.pending, "every command answered")
        assert [(r.action, r.command_id) for r in state.refused] == [
            ("hot_swap", refused.command_id)
        ]
    finally:
        await tap.stop()
        await bus.close()
        stop(*processes, timeout_s=90)


async def test_a_first_launch_no_state_can_hold_is_refused_once_not_retried(
    tmp_path: Path, nats_server: EmbeddedNats
) -> None:
    """#16 item 10: a job started on no node made the controller raise until dead-lettered."""
    controller = spawn_service("controller", JOB, nats_server, tmp_path)
    bus = await Bus.connect(BusSettings(url=nats_server.url), name="test")
    await bus.provision()
    tap = await EventTap(bus, JOB).start()
    try:
        empty = schemas.JobStatus(
            job=JOB, state="running", attempt=1, world_size=0, procs_per_node=1
        )
        await bus.emit(empty)
        refused = await tap.wait_for(
            lambda e: isinstance(e, schemas.Decision) and e.rule == "job-refused", timeout_s=60
        )
        assert "no nodes" in refused.reason and refused.error
        good = schemas.JobStatus(
            job=JOB,
            state="running",
            attempt=1,
            world_size=2,
            procs_per_node=1,
            active_nodes=["node-0", "node-1"],
        )
        await bus.emit(good)
        state = await _wait_state(bus, lambda s: s.active == ["node-0", "node-1"], "job taken up")
        assert state.started_ts > 0
        assert len([d for d in tap.of(schemas.Decision) if d.rule == "job-refused"]) == 1
        assert controller.poll() is None
    finally:
        await tap.stop()
        await bus.close()
        stop(controller, timeout_s=90)
