"""A job on two node agents (two processes, own state directories and node names) under an
actuator running the agent backend: real nats-server, services, agents and ranks."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from goodput import schemas
from goodput.bus import Bus, BusSettings
from goodput.supervisor.agent import registry
from goodput.tools.stack.record import read_stack
from tests.conftest import goodput_cli
from tests.processes import stop
from tests.stack.helpers import EventTap

pytestmark = pytest.mark.slow

JOB = "agents"
STEPS = 20
#: the rules a killed rank may be healed by (a restart that fails under load is retried)
RESTARTS = {"in-process-restart", "in-job-restart", "crash-loop-backoff", "same-incident"}
#: two agents, the stack and two torch ranks share this machine's two cores with the rest of
#: the suite: a heartbeat thread starved for 5 s is no lost rank here
SENSOR = ("--service-set", "sensor:thresholds={straggler_ratio=100.0,heartbeat_timeout_s=20.0}")


def _agent(node: str, state_dir: Path, url: str) -> subprocess.Popen:
    with open(state_dir.with_suffix(".log"), "ab") as log:
        return _spawn_agent(node, state_dir, url, log)


def _spawn_agent(node: str, state_dir: Path, url: str, log) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "goodput.tools.cli.main",
            "agent",
            "--node",
            node,
            "--job",
            JOB,
            "--state-dir",
            str(state_dir),
            "--nats-url",
            url,
            # every agent on this machine: their replicators would share the fixed peer port,
            # and the job's checkpoints are on a shared directory (no tier has to carry them)
            "--no-node-daemons",
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


def _start(tmp_path: Path, name: str, spares: int = 0) -> schemas.StartJob:
    shared = tmp_path / "shared" / name
    return schemas.StartJob(
        job=JOB,
        argv=[
            "python",
            "-m",
            "goodput.examples.gpt.supervised",
            "--steps",
            str(STEPS),
            "--log-every",
            "0",
            "--result",
            str(tmp_path / f"{name}.json"),
        ],
        nodes=2,
        procs_per_node=1,
        spares=spares,
        # a filesystem every host sees (a cluster's shared one): no tier has to carry them
        env={
            "GOODPUT_CKPT_EVERY": "5",
            "GOODPUT_CKPT_MODE": "torch-save",
            "GOODPUT_CKPT_DIR": str(shared),
        },
    )


async def _finished(tap: EventTap, run_id: str, timeout_s: float) -> schemas.JobStatus:
    return await tap.wait_for(
        lambda e: isinstance(e, schemas.JobStatus) and e.run_id == run_id and e.state == "finished",
        timeout_s,
        "the run's end",
    )


async def _wait_live(bus, nodes: set[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while set(await registry.live_agents(bus, JOB)) != nodes:
        assert time.monotonic() < deadline, f"agents {sorted(nodes)} not live in {timeout_s} s"
        await asyncio.sleep(0.2)


def _statuses(tap: EventTap, run_id: str) -> list[schemas.JobStatus]:
    return [e for e in tap.of(schemas.JobStatus) if e.run_id == run_id]


def _rank_children(pid: int) -> list[str]:
    """The actuator's descendants that run the training script (there must be none)."""
    found = []
    for child in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if "goodput.examples.gpt" in " ".join(child.cmdline()):
                found.append(f"{child.pid}: {' '.join(child.cmdline())}")
    return found


@contextlib.asynccontextmanager
async def _stack_with_agents(tmp_path: Path, nodes: tuple[str, ...]):
    """`goodput up` on the agent backend, an agent process per node, a bus connection; all
    stopped afterwards (agents SIGTERM, bounded)."""
    state = tmp_path / "stack"
    goodput_cli(
        "up", "--state-dir", str(state), "--job", JOB, "--nodes", "1", "--wait", "30",
        "--service-set", "actuator:backend=agent",
        "--service-set", "actuator:restore_timeout_s=0",
        *SENSOR,
    )  # fmt: skip
    stack = read_stack(state)
    assert stack is not None
    agents = {n: _agent(n, tmp_path / n, stack.url) for n in nodes}
    bus = None
    try:
        bus = await Bus.connect(BusSettings(url=stack.url), name="test")
        await _wait_live(bus, set(agents), 60)
        yield stack, agents, bus
    finally:
        if bus is not None:
            await bus.close()
        stop(*agents.values(), timeout_s=30)
        goodput_cli("down", "--state-dir", str(state), check=False)


async def test_killing_an_agent_is_a_node_loss_and_its_return_a_repaired_node(
    tmp_path: Path,
) -> None:
    async with _stack_with_agents(tmp_path, ("host-a", "host-b", "host-c")) as (stack, agents, bus):
        tap = await EventTap(bus, JOB).start()
        try:
            start = _start(tmp_path, "node-loss", spares=1)
            await bus.send_command("actuator", start)
            first = await tap.wait_for(
                lambda e: (
                    isinstance(e, schemas.JobStatus)
                    and e.run_id == start.run_id
                    and e.state == "running"
                ),
                120,
                "the run's start",
            )
            assert (first.active_nodes, first.spare_nodes) == (["host-a", "host-b"], ["host-c"])
            await tap.wait_for(
                lambda e: isinstance(e, schemas.StepDone) and e.step >= 5,
                240,
                "step 5",
                after_ts=first.ts,
            )
            agents["host-b"].kill()  # the host is gone: its rank dies with its agent
            swapped = await tap.wait_for(
                lambda e: (
                    isinstance(e, schemas.JobStatus)
                    and e.run_id == start.run_id
                    and "host-b" in e.failed_nodes
                    and e.state == "running"
                ),
                180,
                "host-b replaced",
            )
            assert swapped.active_nodes == ["host-a", "host-c"]
            assert any(d.rule == "hot-swap" for d in tap.of(schemas.Decision))
            # the host comes back: its agent reports it healthy, a repaired node
            agents["host-b"] = _agent("host-b", tmp_path / "host-b-again", stack.url)
            await tap.wait_for(
                lambda e: (
                    isinstance(e, schemas.Signal)
                    and e.signal == "node_returned"
                    and e.node == "host-b"
                ),
                60,
                "host-b returned",
            )
            await _finished(tap, start.run_id, 300)
        finally:
            await tap.stop()


async def test_two_agents_kill_twice_bit_identical_and_refuse_a_held_name(
    tmp_path: Path,
) -> None:
    async with _stack_with_agents(tmp_path, ("host-a", "host-b")) as (stack, agents, bus):
        actuator = next(s.pid for s in stack.services if s.name == "actuator")
        # a second agent for a held name: one line, exit 1, the holder untouched
        held = goodput_cli(
            "agent",
            "--node",
            "host-a",
            "--job",
            JOB,
            "--state-dir",
            str(tmp_path / "dup"),
            "--nats-url",
            stack.url,
            check=False,
            timeout=60,
        )
        assert held.returncode == 1, held.stderr
        assert held.stderr.strip().count("\n") == 0
        assert "host-a" in held.stderr and "held by a live agent" in held.stderr
        assert agents["host-a"].poll() is None

        results = {}
        for name, kills in (("reference", 0), ("interrupted", 2)):
            tap = await EventTap(bus, JOB).start()
            try:
                start = _start(tmp_path, name)
                await bus.send_command("actuator", start)
                begun = await tap.wait_for(
                    lambda e, r=start.run_id: isinstance(e, schemas.RunStarted) and e.run_id == r,
                    60,
                    "the run's start",
                )
                for at_step in (7, 14)[:kills]:
                    await tap.wait_for(
                        lambda e, s=at_step: isinstance(e, schemas.StepDone) and e.step >= s,
                        240,
                        f"step {at_step}",
                        after_ts=begun.ts,
                    )
                    current = _statuses(tap, start.run_id)[-1]
                    assert _rank_children(actuator) == []
                    os.kill(current.pids["host-b"][0], signal.SIGKILL)
                    again = await tap.wait_for(
                        lambda e, a=current.attempt, r=start.run_id: (
                            isinstance(e, schemas.JobStatus)
                            and e.run_id == r
                            and e.attempt > a
                            and e.state == "running"
                        ),
                        120,
                        "the next attempt",
                    )
                    await tap.wait_for(
                        lambda e: isinstance(e, schemas.StepDone),
                        240,
                        "a step of the next attempt",
                        after_ts=again.ts,
                    )
                await _finished(tap, start.run_id, 300)
                results[name] = json.loads((tmp_path / f"{name}.json").read_text())
                rules = {
                    d.rule
                    for d in tap.of(schemas.Decision)
                    if d.ts > begun.ts and d.rule != "checkpoint-interval"
                }
                # each kill healed by a restart (in process first); nothing replaced a node
                assert rules <= RESTARTS and ("in-process-restart" in rules) == bool(kills), rules
            finally:
                await tap.stop()
        assert results["interrupted"]["params_sha256"] == results["reference"]["params_sha256"]
        assert _rank_children(actuator) == []
