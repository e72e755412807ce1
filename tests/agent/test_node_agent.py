"""The node agent in this process against a real nats-server: its claim on the node name,
its ranks (real processes) launched and signalled by commands, and their exits reported
across a bus outage."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest

from goodput import schemas, subjects
from goodput.bus import Bus, BusSettings, DoneLog
from goodput.bus.embedded import EmbeddedNats
from goodput.bus.job_events import JobEvents
from goodput.launch.rank_env import EXIT_CODES
from goodput.supervisor.agent import registry
from goodput.supervisor.agent.node import NodeAgent
from goodput.supervisor.agent.registry import NodeHeld

JOB = "agentjob"
SLEEPER = [sys.executable, "-c", "import time; time.sleep(120)"]


def _agent(nats_server: EmbeddedNats, tmp_path: Path, node: str = "n0") -> NodeAgent:
    return NodeAgent(
        job=JOB,
        node=node,
        address="10.1.2.3",
        gpus=[0, 1],
        bus_settings=BusSettings(url=nats_server.url),
        state_dir=tmp_path / node,
    )


@contextlib.asynccontextmanager
async def _running(agent: NodeAgent, bus: Bus) -> AsyncIterator[NodeAgent]:
    stopping = asyncio.Event()
    task = asyncio.create_task(agent.run(stopping))
    try:
        await _until(lambda: _holder(bus, agent.node), lambda r: r.instance == agent.instance)
        yield agent
    finally:
        stopping.set()
        await asyncio.wait_for(task, 30)


async def _holder(bus: Bus, node: str) -> schemas.AgentRecord | None:
    return await registry.read(bus, JOB, node)


async def _until(read, check, timeout_s: float = 20.0):
    """``read()`` again until ``check`` holds for what it returned (bounded)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(Exception):  # the bus may be coming back
            value = await read()
            if value is not None and check(value):
                return value
        assert time.monotonic() < deadline, f"not reached within {timeout_s} s"
        await asyncio.sleep(0.1)


async def test_a_held_node_name_is_refused_and_free_again_once_its_agent_stops(
    bus: Bus, nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    first = _agent(nats_server, tmp_path)
    async with _running(first, bus):
        second = _agent(nats_server, tmp_path)
        with pytest.raises(NodeHeld, match=rf"node n0 of job {JOB} is held by a live agent pid"):
            await asyncio.wait_for(second.run(asyncio.Event()), 20)
        record = await _holder(bus, "n0")
        assert record is not None and record.instance == first.instance
        assert (record.address, record.gpus, len(record.free_ports)) == ("10.1.2.3", [0, 1], 4)
    # a clean stop frees the name at once (a killed agent's lapses after AGENT_TTL_S)
    assert await _holder(bus, "n0") is None
    third = _agent(nats_server, tmp_path)
    async with _running(third, bus):
        record = await _holder(bus, "n0")
        assert record is not None and record.instance == third.instance


async def test_ranks_run_on_through_a_bus_outage_and_their_exits_are_reported_after_it(
    bus: Bus, nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    agent = _agent(nats_server, tmp_path)
    events = await JobEvents(bus, JOB, all_runs=True).start()
    try:
        async with _running(agent, bus):
            launch = schemas.LaunchRanks(
                job=JOB,
                node="n0",
                run_id="run-1",
                attempt=1,
                argv=SLEEPER,
                ranks=[
                    schemas.RankLaunch(rank=r, local_rank=r, env={"WORLD_SIZE": "2"})
                    for r in (0, 1)
                ],
            )
            target = subjects.node_target(subjects.AGENT, "n0")
            # a launch meant for an earlier agent of the node (sent before this one started,
            # redelivered to it) is not run: the actuator gave up on it and that node's ranks
            stale = msgspec.structs.replace(launch, command_id=schemas.new_id(), ts=1)
            await bus.send_command(target, stale)
            refused = await _until(
                lambda: DoneLog(bus, JOB, target).result(stale.command_id), lambda r: True
            )
            assert not refused.ok and "before the agent of n0 started" in refused.detail
            await bus.send_command(target, launch)
            # launched again (another id, the same ranks of the same attempt): nothing doubles
            again = msgspec.structs.replace(launch, command_id=schemas.new_id())
            await bus.send_command(target, again)
            record = await _until(
                lambda: _holder(bus, "n0"), lambda r: sum(x.running for x in r.ranks) == 2
            )
            assert record.run_id == "run-1" and len(record.ranks) == 2
            pids = {r.rank: r.pid for r in record.ranks}
            await events.wait_for(
                lambda e: (
                    isinstance(e, schemas.HostHealth)
                    and e.node == "n0"
                    and (e.ranks_alive, e.ranks_expected) == (2, 2)
                ),
                10,
                "a host report of both ranks",
            )

            nats_server.stop()
            os.kill(pids[0], signal.SIGKILL)

            async def rank0_code() -> int | None:
                return agent.ranks.ranks[0].process.returncode

            await _until(rank0_code, lambda code: code == -9)
            nats_server.start()

            exited = await events.wait_for(
                lambda e: isinstance(e, schemas.RankExited) and e.rank == 0,
                30,
                "rank 0's exit, seen while the bus was away",
            )
            assert (exited.node, exited.pid, exited.signal, exited.attempt) == (
                "n0",
                pids[0],
                signal.SIGKILL,
                1,
            )
            record = await _until(lambda: _holder(bus, "n0"), lambda r: not r.ranks[0].running)
            assert record.ranks[1].running and record.ranks[1].pid == pids[1]

            await bus.send_command(
                target,
                schemas.SignalRanks(
                    job=JOB, node="n0", attempt=1, signal="term", expected_reason="stop"
                ),
            )
            stopped = await events.wait_for(
                lambda e: isinstance(e, schemas.RankExited) and e.rank == 1,
                30,
                "rank 1's exit on SIGTERM",
            )
            assert (stopped.signal, stopped.expected_reason) == (signal.SIGTERM, "stop")
        assert len(events.of(schemas.RankStarted)) == 2
    finally:
        await events.stop()


async def test_a_rank_poisoned_before_the_shim_ran_is_reported_with_its_cuda_cause(
    bus: Bus, nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    """The agent starts its ranks with the exit hook first on PYTHONPATH: a device-side assert
    at the script's module level (tests/shim's fake CUDA context: no GPU here) exits 86."""
    script = Path(__file__).resolve().parents[1] / "shim" / "cuda_exit_script.py"
    agent = _agent(nats_server, tmp_path)
    events = await JobEvents(bus, JOB, all_runs=True).start()
    try:
        async with _running(agent, bus):
            launch = schemas.LaunchRanks(
                job=JOB,
                node="n0",
                run_id="run-1",
                attempt=1,
                argv=["python", str(script), "import-assert"],
                ranks=[
                    schemas.RankLaunch(
                        rank=0, local_rank=0, env={"WORLD_SIZE": "1", "GOODPUT_JOB": JOB}
                    )
                ],
            )
            await bus.send_command(subjects.node_target(subjects.AGENT, "n0"), launch)
            exited = await events.wait_for(
                lambda e: isinstance(e, schemas.RankExited), 60, "the rank's exit"
            )
            assert (exited.exit_code, exited.signal) == (EXIT_CODES["cuda-context"], None)
    finally:
        await events.stop()
