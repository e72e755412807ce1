"""Standby ranks on node agents against a real nats-server, with real processes: an agent's
pool hands a ready standby a launched rank (cold when none is ready) and makes up what was
taken once the job steps; under an actuator on the agent backend, a restart and a hot swap
take their ranks from the agents' standbys.

The standby is a light script that speaks the real channel (``goodput.launch.standby_channel``, the
local flavour) without importing torch, as in tests/actuator/test_standbys.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest

from goodput import schemas, subjects
from goodput.bus import Bus, BusSettings
from goodput.bus.embedded import EmbeddedNats
from goodput.launch.rank_env import RankEnv
from goodput.state_dir import StateDir
from goodput.supervisor.agent.node import NodeAgent
from tests.actuator.test_standbys import STANDBY_SCRIPT
from tests.agent.test_node_agent import JOB, _holder, _running, _until
from tests.processes import stop
from tests.stack.helpers import EventTap

ARGV = ["python", "-c", STANDBY_SCRIPT]


def _agent(nats_server: EmbeddedNats, tmp_path: Path, node: str) -> NodeAgent:
    return NodeAgent(
        job=JOB,
        node=node,
        address="127.0.0.1",
        gpus=[],
        bus_settings=BusSettings(url=nats_server.url),
        state_dir=tmp_path / node,
        host_report=False,
    )


def _rank(rank: int, attempt: int, standby: bool) -> schemas.RankLaunch:
    env = RankEnv(
        rank=rank,
        local_rank=rank,
        world_size=2,
        local_world_size=2,
        master_addr="127.0.0.1",
        master_port=29500,
        job=JOB,
        node="n0",
        attempt=attempt,
    ).to_env()
    return schemas.RankLaunch(rank=rank, local_rank=rank, env=env, standby=standby)


def _alive(pid: int) -> bool:
    with contextlib.suppress(psutil.Error):
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    return False


async def _logged(path: Path, line: str) -> None:
    for _ in range(300):
        if path.is_file() and line in path.read_text():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{line!r} not in {path}")


async def test_an_agent_hands_a_launched_rank_to_its_ready_standby_else_starts_it_cold(
    bus: Bus, nats_server: EmbeddedNats, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    agent = _agent(nats_server, tmp_path, "n0")
    tap = await EventTap(bus, JOB, all_runs=True).start()
    target = subjects.node_target(subjects.AGENT, "n0")
    try:
        async with _running(agent, bus):
            keep = schemas.KeepStandbys(
                job=JOB, node="n0", run_id="run-1", count=1, argv=ARGV, at_once=True
            )
            await bus.send_command(target, keep)
            assert (await tap.result_of(keep)).ok
            record = await _until(lambda: _holder(bus, "n0"), lambda r: len(r.standbys) == 1)
            standby = record.standbys[0]

            warm = schemas.LaunchRanks(
                job=JOB, node="n0", run_id="run-1", attempt=1, argv=ARGV, ranks=[_rank(0, 1, True)]
            )
            await bus.send_command(target, warm)
            assert "from standbys" in (await tap.result_of(warm)).detail
            record = await _until(lambda: _holder(bus, "n0"), lambda r: len(r.ranks) == 1)
            assert (record.ranks[0].pid, record.ranks[0].running, record.standbys) == (
                standby,
                True,
                [],
            )
            started = tap.of(schemas.RankStarted)
            assert [(e.rank, e.pid, e.attempt) for e in started] == [(0, standby, 1)]
            # the assignment is the rank's environment
            await _logged(
                StateDir(tmp_path / "n0").standby_logs / "standby-n0-001.log",
                "rank 0 of 2 on n0 attempt 1",
            )

            # none is ready (none is made up before the job steps): the rank starts cold
            cold = schemas.LaunchRanks(
                job=JOB, node="n0", run_id="run-1", attempt=1, argv=ARGV, ranks=[_rank(1, 1, True)]
            )
            await bus.send_command(target, cold)
            assert "from standbys" not in (await tap.result_of(cold)).detail
            assert "no standby to take on n0 (none is ready): starting the rank cold" in caplog.text
            record = await _until(lambda: _holder(bus, "n0"), lambda r: len(r.ranks) == 2)
            cold_pid = record.ranks[1].pid
            assert cold_pid != standby and not record.standbys

            # the job steps: the taken standby is made up
            await bus.emit(
                schemas.StepDone(
                    job=JOB, node="n0", rank=0, step=1, step_time_s=0.1, tokens=1, loss=0
                )
            )
            record = await _until(lambda: _holder(bus, "n0"), lambda r: len(r.standbys) == 1)
            fresh = record.standbys[0]
            assert fresh not in (standby, cold_pid)
        # the agent stopped: its ranks and its standbys with it
        for pid in (standby, cold_pid, fresh):
            await _until(lambda p=pid: asyncio.sleep(0, not _alive(p)), bool, 10)
    finally:
        await tap.stop()


# ---- the whole stack: an actuator on the agent backend, three agents ------------------------


@contextlib.asynccontextmanager
async def _actuator(nats_server: EmbeddedNats, state_dir: Path) -> AsyncIterator[None]:
    state_dir.mkdir(parents=True, exist_ok=True)
    with open(state_dir / "actuator.log", "ab") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "goodput_services.actuator",
                "--job",
                JOB,
                "--nats-url",
                nats_server.url,
                "--state-dir",
                str(state_dir),
                "--set",
                "backend=agent",
                "--set",
                "restore_timeout_s=0",
            ],
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    try:
        yield
    finally:
        stop(process, timeout_s=90)


@contextlib.asynccontextmanager
async def _agents(
    nats_server: EmbeddedNats, tmp_path: Path, bus: Bus, nodes: list[str]
) -> AsyncIterator[None]:
    async with contextlib.AsyncExitStack() as stack:
        for node in nodes:
            await stack.enter_async_context(_running(_agent(nats_server, tmp_path, node), bus))
        yield


async def _stepped(bus: Bus) -> None:
    """The job trains: what the agents wait for before they make up their standbys."""
    await bus.emit(
        schemas.StepDone(job=JOB, node="n0", rank=0, step=1, step_time_s=0.1, tokens=1, loss=0)
    )


async def _standbys_on(tap: EventTap, nodes: set[str], after_ts: int) -> schemas.JobStatus:
    return await tap.wait_for(
        lambda e: isinstance(e, schemas.JobStatus) and set(e.standbys) == nodes,
        60,
        f"ready standbys on {sorted(nodes)}",
        after_ts=after_ts,
    )


async def _attempt(tap: EventTap, attempt: int) -> schemas.JobStatus:
    return await tap.wait_for(
        lambda e: (
            isinstance(e, schemas.JobStatus) and e.attempt == attempt and e.state == "running"
        ),
        60,
        f"attempt {attempt} running",
    )


def _rank_pids(tap: EventTap, attempt: int) -> dict[str, int]:
    return {e.node: e.pid for e in tap.of(schemas.RankStarted) if e.attempt == attempt}


async def test_a_restart_and_a_hot_swap_take_the_agents_standbys(
    bus: Bus, nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    tap = await EventTap(bus, JOB).start()
    try:
        async with (
            _agents(nats_server, tmp_path, bus, ["n0", "n1", "n2"]),
            _actuator(nats_server, tmp_path / "actuator"),
        ):
            start = schemas.StartJob(
                job=JOB, argv=ARGV, nodes=2, procs_per_node=1, spares=1, standbys=1
            )
            await bus.send_command(subjects.ACTUATOR, start)
            assert (await tap.result_of(start, 60)).ok, tap.of(schemas.ActionResult)
            first = await _attempt(tap, 1)
            assert first.capabilities is not None and first.capabilities.standbys == "all"
            assert not first.standbys  # none is started while the ranks start up
            await _stepped(bus)
            ready = await _standbys_on(tap, {"n0", "n1", "n2"}, first.ts)
            standbys = {n: pids[0] for n, pids in ready.standbys.items()}
            # standbys are no ranks
            assert not set(standbys.values()) & {p for ps in ready.pids.values() for p in ps}

            os.kill(first.pids["n1"][0], signal.SIGKILL)
            restart = schemas.Restart(job=JOB, reason="test", standbys=True)
            await bus.send_command(subjects.ACTUATOR, restart)
            assert (await tap.result_of(restart, 60)).ok
            second = await _attempt(tap, 2)
            assert _rank_pids(tap, 2) == {"n0": standbys["n0"], "n1": standbys["n1"]}
            assert second.pids == {"n0": [standbys["n0"]], "n1": [standbys["n1"]]}
            await _logged(
                StateDir(tmp_path / "n1").standby_logs / "standby-n1-001.log",
                "rank 1 of 2 on n1 attempt 2",
            )

            await _stepped(bus)
            again = await _standbys_on(tap, {"n0", "n1", "n2"}, second.ts)
            assert again.standbys["n2"] == [standbys["n2"]]
            assert again.standbys["n1"] != [standbys["n1"]]

            # a hot swap takes the spare's standby for the spare's rank
            swap = schemas.HotSwap(job=JOB, failed_node="n1", spare_node="n2", standbys=True)
            await bus.send_command(subjects.ACTUATOR, swap)
            assert (await tap.result_of(swap, 60)).ok
            third = await _attempt(tap, 3)
            assert _rank_pids(tap, 3)["n2"] == standbys["n2"]
            # the failed node keeps no standby (its agent was told so)
            left = again.standbys["n1"][0]
            await _until(lambda: asyncio.sleep(0, not _alive(left)), bool, 20)
            await _stepped(bus)
            kept = await _standbys_on(tap, {"n0", "n2"}, third.ts)

            stop = schemas.Stop(job=JOB, reason="test")
            await bus.send_command(subjects.ACTUATOR, stop)
            # within the grace: the agents' records show the ranks' exits to the stop
            assert (await tap.result_of(stop, 30)).ok
            for pid in [p for ps in kept.standbys.values() for p in ps]:  # stopped with the run
                await _until(lambda p=pid: asyncio.sleep(0, not _alive(p)), bool, 20)
    finally:
        await tap.stop()
