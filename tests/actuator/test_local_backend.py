"""The actuator service with its local backend, driving real rank processes."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from goodput import schemas
from goodput.bus import Bus, EmbeddedNats
from goodput.bus.embedded import pid_alive
from goodput.launch.rank_env import EXIT_CODES, rank_fault
from tests.actuator.local_actuator import JOB, RANK_SCRIPT, Actuator, running_actuator
from tests.stack.helpers import EventTap


@pytest.fixture
async def rig(
    tmp_path: Path, nats_server: EmbeddedNats
) -> AsyncIterator[tuple[Bus, EventTap, Actuator]]:
    async with running_actuator(nats_server, tmp_path) as running:
        yield running


def _start(nodes: int = 2, procs: int = 2, spares: int = 1, **env: str) -> schemas.StartJob:
    return schemas.StartJob(
        job=JOB,
        argv=[sys.executable, "-c", RANK_SCRIPT],
        nodes=nodes,
        procs_per_node=procs,
        spares=spares,
        env=env,
    )


async def _status(tap: EventTap, attempt: int) -> schemas.JobStatus:
    return await tap.wait_for(
        lambda e: (
            isinstance(e, schemas.JobStatus) and e.attempt == attempt and e.state == "running"
        ),
        what=f"running status of attempt {attempt}",
    )


async def test_start_sets_torchrun_environment_and_reports_ranks(rig, tmp_path: Path) -> None:
    bus, tap, _ = rig
    start = _start()
    await bus.send_command("actuator", start)
    assert (await tap.result_of(start)).ok
    status = await _status(tap, 1)
    assert status.active_nodes == ["node-0", "node-1"] and status.spare_nodes == ["node-2"]
    assert status.world_size == 4
    # the policy reads what the backend can do from the status, not from a refusal
    assert status.capabilities is not None and status.capabilities.backend == "local"
    assert status.capabilities.in_process_restart and status.capabilities.standbys == "all"
    started = tap.of(schemas.RankStarted)
    assert sorted((e.node, e.rank, e.local_rank) for e in started) == [
        ("node-0", 0, 0),
        ("node-0", 1, 1),
        ("node-1", 2, 0),
        ("node-1", 3, 1),
    ]
    await asyncio.sleep(1.0)
    logs = sorted((tmp_path / "logs" / "ranks" / "attempt-001").glob("*.log"))
    assert "rank 3 of 4 on node-1" in logs[-1].read_text()


async def test_a_killed_rank_is_reported_and_a_restart_relaunches_the_group(rig) -> None:
    bus, tap, _ = rig
    await bus.send_command("actuator", _start())
    status = await _status(tap, 1)
    victim = status.pids["node-1"][0]
    os.kill(victim, signal.SIGKILL)
    exited = await tap.wait_for(lambda e: isinstance(e, schemas.RankExited) and e.pid == victim)
    assert (
        exited.signal == signal.SIGKILL
        and exited.exit_code is None
        and exited.expected_reason == ""
    )
    restart = schemas.Restart(job=JOB, reason="crash")
    await bus.send_command("actuator", restart)
    assert (await tap.result_of(restart)).ok
    second = await _status(tap, 2)
    assert second.world_size == 4
    assert not any(pid_alive(p) for pids in status.pids.values() for p in pids)
    killed = [e for e in tap.of(schemas.RankExited) if e.attempt == 1 and e.pid != victim]
    assert {e.expected_reason for e in killed} == {"restart"}


async def test_hot_swap_keeps_the_world_size(rig) -> None:
    bus, tap, _ = rig
    await bus.send_command("actuator", _start())
    await _status(tap, 1)
    swap = schemas.HotSwap(job=JOB, failed_node="node-0")
    await bus.send_command("actuator", swap)
    assert (await tap.result_of(swap)).ok
    status = await _status(tap, 2)
    assert status.active_nodes == ["node-2", "node-1"]
    assert status.failed_nodes == ["node-0"] and status.world_size == 4


async def test_scale_down_then_up_when_the_node_returns(rig) -> None:
    bus, tap, _ = rig
    await bus.send_command("actuator", _start(spares=0))
    await _status(tap, 1)
    down = schemas.ScaleTo(job=JOB, num_dp_replicas=1, drop_nodes=["node-1"])
    await bus.send_command("actuator", down)
    assert (await tap.result_of(down)).ok
    assert (await _status(tap, 2)).world_size == 2
    back = schemas.ReturnNode(job=JOB, node="node-1")
    await bus.send_command("actuator", back)
    assert (await tap.result_of(back)).ok
    up = schemas.ScaleTo(job=JOB, num_dp_replicas=2, nodes=["node-0", "node-1"])
    await bus.send_command("actuator", up)
    assert (await tap.result_of(up)).ok
    status = await _status(tap, 3)
    assert status.world_size == 4 and status.active_nodes == ["node-0", "node-1"]
    graceful = [e for e in tap.of(schemas.RankExited) if e.attempt == 2]
    assert {e.expected_reason for e in graceful} == {"scale_up"}
    assert all(e.signal == signal.SIGTERM for e in graceful)


async def test_commands_for_unknown_nodes_are_rejected_not_fatal(rig) -> None:
    bus, tap, actuator = rig
    await bus.send_command("actuator", _start(spares=0))
    await _status(tap, 1)
    for command in (
        schemas.HotSwap(job=JOB, failed_node="node-9"),
        schemas.HotSwap(job=JOB, failed_node="node-0"),  # no spare
        schemas.ScaleTo(job=JOB, num_dp_replicas=1, nodes=["ghost"]),
        schemas.ReturnNode(job=JOB, node="ghost"),
    ):
        await bus.send_command("actuator", command)
        result = await tap.result_of(command)
        assert not result.ok and result.detail
    assert actuator.process.poll() is None


async def test_a_job_of_no_shape_is_refused_and_a_good_one_starts_after(rig) -> None:
    """#16 item 10: `goodput run --nodes 0` was started with no rank and never ended."""
    bus, tap, actuator = rig
    for bad in (_start(nodes=0), _start(procs=0), _start(nodes=3, procs=1, spares=-1)):
        await bus.send_command("actuator", bad)
        result = await tap.result_of(bad)
        assert not result.ok and "a job needs at least 1 node" in result.detail
    odd = schemas.StartJob(job=JOB, argv=["true"], nodes=3, procs_per_node=1, num_nodes_per_dp=2)
    await bus.send_command("actuator", odd)
    assert "do not form whole replicas" in (await tap.result_of(odd)).detail
    assert tap.of(schemas.RankStarted) == [] and tap.of(schemas.JobStatus) == []
    good = _start(spares=0)
    await bus.send_command("actuator", good)
    assert (await tap.result_of(good)).ok
    assert (await _status(tap, 1)).world_size == 4
    assert actuator.process.poll() is None


async def test_a_rank_poisoned_before_the_shim_ran_exits_with_its_cuda_cause(rig) -> None:
    """A device-side assert while the script builds its model, before any goodput import (the
    fake CUDA context of tests/shim: no GPU here): the rank's exit names the cause (86), which
    the sensor reads as a poisoned context, not as an ordinary crash (1)."""
    bus, tap, _ = rig
    script = Path(__file__).resolve().parents[1] / "shim" / "cuda_exit_script.py"
    start = msgspec.structs.replace(
        _start(nodes=1, procs=1, spares=0), argv=[sys.executable, str(script), "import-assert"]
    )
    await bus.send_command("actuator", start)
    exited = await tap.wait_for(lambda e: isinstance(e, schemas.RankExited), 120)
    assert exited.exit_code == EXIT_CODES["cuda-context"] and exited.signal is None
    assert rank_fault(exited.exit_code) == "cuda-context"


async def test_job_finishes_when_every_rank_exits_zero(rig) -> None:
    bus, tap, _ = rig
    await bus.send_command("actuator", _start(nodes=1, procs=2, spares=0, EXIT_AFTER="0"))
    status = await tap.wait_for(
        lambda e: isinstance(e, schemas.JobStatus) and e.state == "finished"
    )
    assert status.attempt == 1


async def test_each_start_is_a_new_run_and_a_start_during_a_run_is_refused(rig) -> None:
    bus, tap, _ = rig
    first = _start(nodes=1, procs=1, spares=0)
    await bus.send_command("actuator", first)
    assert (await tap.result_of(first)).ok
    await _status(tap, 1)
    clash = _start(nodes=1, procs=1, spares=0)
    await bus.send_command("actuator", clash)
    refused = await tap.result_of(clash)
    assert not refused.ok and f"job {JOB} is already running (attempt 1" in refused.detail
    restart = schemas.Restart(job=JOB, reason="a second attempt")
    await bus.send_command("actuator", restart)
    await _status(tap, 2)
    stop = schemas.Stop(job=JOB, reason="done")
    await bus.send_command("actuator", stop)
    assert (await tap.result_of(stop)).ok
    second = _start(nodes=1, procs=1, spares=0, EXIT_AFTER="0")
    await bus.send_command("actuator", second)
    assert (await tap.result_of(second)).ok
    await tap.wait_for(
        lambda e: isinstance(e, schemas.JobStatus) and e.state == "finished",
        what="the second run finishing",
    )
    third = _start(nodes=1, procs=1, spares=0)
    await bus.send_command("actuator", third)
    assert (await tap.result_of(third)).ok
    # the third run counts its attempts from 1 again, says which run it is, and lists only
    # its own rank (not the second run's, exited but never stopped)
    status = await tap.wait_for(
        lambda e: isinstance(e, schemas.JobStatus) and e.run_id == third.run_id,
        what="the third run's status",
    )
    assert (status.state, status.attempt) == ("running", 1)
    assert [len(pids) for pids in status.pids.values()] == [1]
    runs = [e.run_id for e in tap.of(schemas.RunStarted)]
    assert runs == [first.run_id, second.run_id, third.run_id]
    # a follower that starts now sees the newest run from its start, nothing of the others
    newest = await EventTap(bus, JOB).start()
    try:
        await newest.wait_for(lambda e: isinstance(e, schemas.JobStatus), what="a status")
        assert isinstance(newest.events[0], schemas.RunStarted)
        assert newest.events[0].run_id == third.run_id
        assert {s.run_id for s in newest.of(schemas.JobStatus)} == {third.run_id}
        assert {e.attempt for e in newest.of(schemas.RankStarted)} == {1}
    finally:
        await newest.stop()
