"""Two controller processes: the standby finishes a remediation the leader died in."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from goodput import schemas, subjects
from goodput.bus import Bus, BusSettings, EmbeddedNats
from goodput.bus.service_health import read_records
from goodput.supervisor.policy.scripts import cold_restart
from tests.controller.helpers import spawn_service
from tests.processes import stop
from tests.stack.helpers import EventTap

pytestmark = pytest.mark.slow
JOB = "job-ha"
SLEEPER = "import time; time.sleep(600)"
#: the sleepers cannot restart in process: the cold restart is what this test is about
COLD = f"policy={cold_restart.__file__}"


async def _leader(bus: Bus) -> str:
    """The health detail of the controller replica that leads ("" while none does)."""
    records, _ = await read_records(bus, JOB)
    details = [r.detail for r in records if r.service == "controller"]
    return next((detail for detail in details if detail.startswith("leader")), "")


async def test_standby_finishes_the_remediation_and_nothing_runs_twice(
    tmp_path: Path, nats_server: EmbeddedNats
) -> None:
    processes = [
        spawn_service("actuator", JOB, nats_server, tmp_path, "restore_timeout_s=0"),
        spawn_service("sensor", JOB, nats_server, tmp_path),
    ]
    # the first controller holds each decision for 5 s between storing and sending it
    doomed = spawn_service(
        "controller",
        JOB,
        nats_server,
        tmp_path,
        "inject_pause_before_send_s=5.0",
        "lease_ttl_s=2.0",
        COLD,
    )
    processes.append(doomed)
    bus = await Bus.connect(BusSettings(url=nats_server.url), name="test")
    await bus.provision()
    tap = await EventTap(bus, JOB).start()
    try:
        for _ in range(100):
            try:
                if (await _leader(bus)).startswith("leader"):
                    break
            except Exception:
                pass
            await asyncio.sleep(0.2)
        processes.append(
            spawn_service("controller", JOB, nats_server, tmp_path, "lease_ttl_s=2.0", COLD)
        )
        start = schemas.StartJob(
            job=JOB, argv=[sys.executable, "-c", SLEEPER], nodes=2, procs_per_node=1, spares=1
        )
        await bus.send_command(subjects.ACTUATOR, start)
        status = await tap.wait_for(
            lambda e: isinstance(e, schemas.JobStatus) and e.state == "running" and e.attempt == 1
        )
        await asyncio.sleep(2.0)  # the controller has seen the job start
        os.kill(status.pids["node-1"][0], signal.SIGKILL)
        await tap.wait_for(lambda e: isinstance(e, schemas.Signal) and e.signal == "crash")
        await asyncio.sleep(1.0)  # the leader stored its decision and is pausing before sending
        doomed.kill()
        relaunched = await tap.wait_for(
            lambda e: isinstance(e, schemas.JobStatus) and e.attempt == 2 and e.state == "running",
            timeout_s=60,
        )
        assert relaunched.active_nodes == ["node-0", "node-1"]
        await asyncio.sleep(3.0)  # anything sent twice would have been executed by now
        restarts = [
            r for r in tap.of(schemas.ActionResult) if r.action == "restart" and not r.duplicate
        ]
        assert len(restarts) == 1 and restarts[0].ok
        decisions = [d for d in tap.of(schemas.Decision) if d.rule == "in-job-restart"]
        assert decisions and {d.command_ids[0] for d in decisions} == {restarts[0].command_id}
        assert max(e.attempt for e in tap.of(schemas.JobStatus)) == 2
    finally:
        await tap.stop()
        await bus.close()
        stop(*processes, timeout_s=90)
