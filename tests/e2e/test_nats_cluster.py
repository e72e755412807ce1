"""The whole stack on a three-server NATS cluster (`goodput up --nats-cluster 3`) loses one
server during a remediation and another (the first back) during checkpoint traffic: the job
reaches its last step, every command the stream holds ran exactly once, and the report's
replay of the bus misses no step."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest

from goodput import schemas, subjects
from goodput.bus import Bus
from goodput.bus.client import retry_transient
from goodput.examples.gpt import supervised_argv
from goodput.launch.rank_env import knobs
from goodput.measure.accounting.sources import replay_from_bus
from tests.conftest import goodput_cli
from tests.stack.helpers import job_on_stack, wait_for_results

pytestmark = pytest.mark.slow

JOB = "ha"
STEPS = 12
#: seconds each killed server stays down: longer than a stream's leader election
DOWN_S = "4"


async def _leader(bus: Bus, stream: str) -> int:
    info = await bus.js.stream_info(stream)
    assert info.cluster is not None and info.cluster.leader
    return int(info.cluster.leader.rsplit("-", 1)[1])


async def _restart_leader_of(bus: Bus, stream: str, state_dir: Path) -> None:
    """SIGKILL the server leading ``stream``, and start it again after :data:`DOWN_S`."""
    member = await _leader(bus, stream)
    result = await asyncio.to_thread(
        goodput_cli,
        "chaos",
        "restart-nats",
        "--member",
        str(member),
        "--down-s",
        DOWN_S,
        "--state-dir",
        str(state_dir),
    )
    assert "restarted" in result.stdout, result.stdout + result.stderr


async def _commands(bus: Bus) -> list[str]:
    """The ids of every command the commands stream holds for the job's services (commands to
    the ranks are read by the shim, which records no result), each read by its sequence from
    the stream's leader: a consumer created on a cluster that has just lost a server can sit
    unready past any fetch timeout (one fetched nothing for 20 s in a clean-clone run)."""
    info = await retry_transient(
        lambda: bus.js.stream_info(subjects.COMMANDS_STREAM), deadline_s=60, what="stream info"
    )
    prefix, ids = f"gp.{JOB}.cmd.", []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        message = await retry_transient(
            lambda seq=seq: bus.js.get_msg(subjects.COMMANDS_STREAM, seq),
            deadline_s=60,
            what=f"command {seq}",
        )
        if message.subject.startswith(prefix) and message.subject != subjects.command(
            JOB, subjects.TRAINER
        ):
            ids.append(schemas.decode_command(message.data).command_id)
    return ids


async def test_a_job_outlives_two_nats_servers_killed_in_turn(tmp_path: Path) -> None:
    state_dir = tmp_path / "stack"
    start = schemas.StartJob(
        job=JOB,
        argv=supervised_argv(STEPS),
        nodes=1,
        procs_per_node=1,
        spares=0,
        env=knobs(ckpt_every=2),
    )
    async with job_on_stack(state_dir, JOB, 1, start, "--nats-cluster", "3") as (bus, tap):
        started = await tap.wait_for(
            lambda e: isinstance(e, schemas.StepDone) and e.step >= 3, 180, "step 3"
        )
        rank = next(e for e in tap.of(schemas.RankStarted) if e.rank == 0)
        os.kill(rank.pid, signal.SIGKILL)  # a remediation begins: the rank is restarted
        await _restart_leader_of(bus, subjects.COMMANDS_STREAM, state_dir)
        await tap.wait_for(
            lambda e: isinstance(e, schemas.CheckpointSaved),
            180,
            "a checkpoint after the remediation",
            after_ts=started.ts + 1,
        )
        await _restart_leader_of(bus, subjects.EVENTS_STREAM, state_dir)
        finished = await tap.wait_for(
            lambda e: isinstance(e, schemas.JobStatus) and e.state == "finished", 300, "the end"
        )
        assert finished.attempt >= 2, "the killed rank was restarted"
        commands = await _commands(bus)
        results = await wait_for_results(bus, JOB, set(commands), timeout_s=60)
        replayed = await replay_from_bus(bus, JOB)
    assert len(commands) == len(set(commands)), "each command stored once"
    assert commands and all(results[c] == 1 for c in commands), (commands, results)
    steps = {e.step for e in replayed if isinstance(e, schemas.StepDone)}
    assert steps == set(range(1, STEPS + 1)), "the report replays every step"
