"""Warm restart through the real actuator, bus and rank processes: what happens when ranks
cannot rejoin in process (the restart then fails, saying why, and a cold one still works),
and a Rejoin for an attempt a rank has already reached."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from goodput import schemas, subjects
from goodput.state_dir import StateDir

from .test_local_backend import JOB, RANK_SCRIPT, _start, _status, rig  # noqa: F401

# A supervised rank whose loop is the shim's: it takes Rejoin commands but never gets to one
# (no step fails), so a Rejoin for its own attempt is all it can see. Like a training loop it
# ends on SIGTERM (the shim's stop flag): a rank that slept through it would hold every
# teardown for the actuator's whole stop grace before the SIGKILL.
SHIM_RANK = (
    "import logging, time\n"
    "logging.basicConfig(level=logging.INFO)\n"
    "from goodput.shim import TrainerShim\n"
    "from goodput.shim.link import wait_for_bus\n"
    "shim = TrainerShim.from_env()\n"
    "if {in_loop}:\n"
    "    shim.enable_in_process_restart()\n"
    "wait_for_bus(shim.link)\n"
    "print('ready', flush=True)\n"
    "while not shim.should_stop():\n"
    "    time.sleep(0.1)\n"
)


def _shim_start(in_loop: bool) -> schemas.StartJob:
    script = SHIM_RANK.format(in_loop=in_loop)
    return schemas.StartJob(
        job=JOB, argv=[sys.executable, "-c", script], nodes=2, procs_per_node=1, spares=0
    )


async def _ranks_ready(state_dir: Path) -> None:
    """Both ranks' shims are on the bus (importing torch takes long on a loaded machine)."""
    logs = [StateDir(state_dir).rank_logs(1) / f"node-{n}-rank{n}.log" for n in (0, 1)]
    for _ in range(1200):
        if all(log.is_file() and "ready" in log.read_text() for log in logs):
            return
        await asyncio.sleep(0.1)
    raise AssertionError("the shim ranks did not come up")


async def _result(tap, command: schemas.Command) -> schemas.ActionResult:
    return await tap.result_of(command, timeout_s=90)


async def test_a_rendezvous_that_never_completes_fails_by_the_deadline_then_cold_works(
    rig,  # noqa: F811
) -> None:
    bus, tap, _ = rig
    # ranks that are not supervised at all never answer a Rejoin: the deadline decides
    await bus.send_command(subjects.ACTUATOR, _start(nodes=2, procs=1, spares=0))
    first = await _status(tap, 1)
    warm = schemas.RestartInProcess(job=JOB, deadline_s=2.0, reason="test")
    await bus.send_command(subjects.ACTUATOR, warm)
    result = await _result(tap, warm)
    assert not result.ok
    assert "rank 0 did not rejoin within 2 s" in result.detail
    assert "rank 1 did not rejoin within 2 s" in result.detail
    # nothing is left half-joined: every rank of the failed attempt was stopped
    exits = [e for e in tap.of(schemas.RankExited) if e.attempt == 2]
    assert {e.expected_reason for e in exits} == {"in-process restart failed"}
    assert {e.pid for e in exits} == {p for pids in first.pids.values() for p in pids}
    cold = schemas.Restart(job=JOB, reason="after the failed warm restart")
    await bus.send_command(subjects.ACTUATOR, cold)
    assert (await _result(tap, cold)).ok
    await _status(tap, 3)


@pytest.mark.slow  # shim ranks import torch: tens of seconds on a loaded machine
async def test_a_rank_whose_loop_is_not_the_shims_refuses_at_once(
    rig,  # noqa: F811
    tmp_path: Path,
) -> None:
    bus, tap, _ = rig
    await bus.send_command(subjects.ACTUATOR, _shim_start(in_loop=False))
    await _status(tap, 1)
    await _ranks_ready(tmp_path)
    warm = schemas.RestartInProcess(job=JOB, deadline_s=60.0, reason="test")
    await bus.send_command(subjects.ACTUATOR, warm)
    result = await _result(tap, warm)
    assert not result.ok
    assert "its training loop is not the shim's" in result.detail
    assert result.duration_s < 60  # answered, not waited out


@pytest.mark.slow
async def test_a_rejoin_for_an_attempt_already_reached_is_ignored_and_logged(
    rig,  # noqa: F811
    tmp_path: Path,
) -> None:
    bus, tap, _ = rig
    await bus.send_command(subjects.ACTUATOR, _shim_start(in_loop=True))
    await _status(tap, 1)
    await _ranks_ready(tmp_path)
    old = schemas.Rejoin(
        job=JOB, attempt=1, master_addr="127.0.0.1", master_port=1, world_size=2, reason="old"
    )
    await bus.send_command(subjects.TRAINER, old)
    log = StateDir(tmp_path).rank_logs(1) / "node-0-rank0.log"
    for _ in range(200):
        if "ignoring Rejoin for attempt 1: this rank is at attempt 1" in log.read_text():
            break
        await asyncio.sleep(0.1)
    else:
        raise AssertionError(f"no log line for the old Rejoin in {log.read_text()!r}")
    assert not tap.of(schemas.RankRejoined)
