"""The by-hand agent path across hosts (issue 37): three network namespaces as three machines
on one switch, a node agent on each (two active, one spare) with the host monitor and the
replicator it runs, the bus and the central services in the root namespace, and a gloo job
checkpointing to each host's own directory — no shared checkpoint directory. The host name
resolves to a loopback address here (as on a stock Debian host), so the job's collectives work
only if the agent names the interface of its address for them.

A lost node — every process of one active host killed — is hot-swapped for the spare, whose
empty volume its replicator fills from a peer over the network before the actuator relaunches
(the spare holds no copy: the replicators send theirs to a close peer, and the spare is in
another block), and the job completes from that checkpoint. A partitioned node — its link cut,
everything on it running on — is hot-swapped the same way, and when its link is back the
rank it still runs, of the attempt given up, is killed on the actuator's order."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest

from goodput import schemas
from goodput.bus import Bus, BusSettings
from goodput.bus.embedded import nats_server_binary
from goodput.bus.settings import ENV_VARS
from goodput.checkpoint.format import node_volume, step_dirs
from goodput.checkpoint.format.job_key import KEY_FILE_ENV, create_key_file
from goodput.launch.collective_sockets import VARIABLES
from goodput.state_dir import StateDir
from goodput.supervisor.agent import registry
from goodput_services.actuator.agent_backend import STRAY_REASON
from tests.agent.netns_bridge import ROOT_ADDRESS, Network, bridged_hosts
from tests.processes import stop
from tests.stack.helpers import EventTap

pytestmark = pytest.mark.slow

JOB = "acrosshosts"
STEPS = 20
NODES = ["host-a", "host-b", "host-c"]
#: the replicators' options: fast polling, a store every host reaches, one peer copy each,
#: to a close peer first: the active hosts share a block, the spare is in another, so the
#: spare holds no copy when it is swapped in and must fetch one from a peer
REPLICATOR = """
[services.replicator]
poll_s = 0.2
node_ttl_s = 6
dedup_wait_s = 0.5
backup_wait_s = 2
replicas = 1
store_retry_s = 3
gc_interval_s = 3600
object_store = "dir:{store}"
labels = {{block = "{block}"}}
"""
BLOCKS = {"host-a": "b0", "host-b": "b0", "host-c": "b1"}
#: a checkpoint of this step or later replicated before the host is lost
LOST_AFTER_STEP = 5
#: a rank starting on two busy cores (torch's import, the model) was silent for 10-15 s here
#: before its first heartbeat, which a 10 s timeout judged a missed heartbeat (a restart more)
SENSOR_THRESHOLDS = "thresholds={straggler_ratio=100.0,heartbeat_timeout_s=20.0}"


def _free_port(address: str) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


def _tails(paths: list[Path]) -> str:
    return json.dumps(
        {str(p): p.read_text(errors="replace")[-1500:] for p in paths if p.exists()}, indent=1
    )


def _start_bus(work: Path, port: int, password: str) -> subprocess.Popen:
    conf = work / "nats.conf"
    conf.write_text(
        f'listen: "{ROOT_ADDRESS}:{port}"\n'
        f'jetstream {{ store_dir: "{work / "nats-store"}" }}\n'
        f'authorization {{ user: "goodput", password: "{password}" }}\n'
    )
    log = work / "nats.log"
    with open(log, "ab") as out:
        server = subprocess.Popen(
            [nats_server_binary(), "--config", str(conf)], stdout=out, stderr=subprocess.STDOUT
        )
    deadline = time.monotonic() + 30
    while "Server is ready" not in log.read_text(errors="replace"):
        assert server.poll() is None and time.monotonic() < deadline, _tails([log])
        time.sleep(0.1)
    return server


def _start_services(work: Path, env: dict[str, str]) -> list[subprocess.Popen]:
    """The central services in the root namespace: the actuator on the agent backend, with
    its real pre-launch restore (the replicators answer it)."""
    flags = {
        "sensor": ["--set", SENSOR_THRESHOLDS],
        "controller": [],
        "actuator": ["--set", "backend=agent"],
    }
    started = []
    for name, extra in flags.items():
        with open(work / f"{name}.log", "ab") as out:
            started.append(
                subprocess.Popen(
                    [
                        *(sys.executable, "-m", f"goodput_services.{name}", "--job", JOB),
                        *("--state-dir", str(work / "stack"), *extra),
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
            )
    return started


def _start_agent(network: Network, node: str, work: Path, url: str, env: dict[str, str]):
    command = [sys.executable, "-m", "goodput.tools.cli.main", "agent", "--node", node]
    command += ["--job", JOB, "--state-dir", str(work / node), "--nats-url", url]
    command += ["--config", str(work / f"goodput-{node}.toml")]
    return network.hosts[node].start(command, work / f"agent-{node}.log", env)


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


async def _live(bus: Bus, nodes: set[str], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while set(await registry.live_agents(bus, JOB)) != nodes:
        assert time.monotonic() < deadline, f"agents {sorted(nodes)} not live in {timeout_s} s"
        await asyncio.sleep(0.2)


def _job_status(run_id: str, check) -> object:
    return lambda e: isinstance(e, schemas.JobStatus) and e.run_id == run_id and check(e)


@contextlib.asynccontextmanager
async def _three_hosts(tmp_path: Path) -> AsyncIterator[tuple[Network, Bus, EventTap]]:
    """The bus and the central services in the root namespace, an agent (with its daemons)
    on each host, the test's own bus connection and event tap; all stopped afterwards, the
    logs printed on a failure."""
    password = secrets.token_hex(16)
    key = create_key_file(tmp_path / "ckpt.key")
    for node, block in BLOCKS.items():
        config = REPLICATOR.format(store=tmp_path / "object-store", block=block)
        (tmp_path / f"goodput-{node}.toml").write_text(config)
    with bridged_hosts(NODES) as network:
        port = _free_port(ROOT_ADDRESS)
        url = f"nats://{ROOT_ADDRESS}:{port}"
        env = {
            **os.environ,
            ENV_VARS["url"]: url,
            ENV_VARS["user"]: "goodput",
            ENV_VARS["password"]: password,
            KEY_FILE_ENV: str(key),
            "PYTHONUNBUFFERED": "1",
        }
        for name in VARIABLES:  # what the agent sets must not come from this test's shell
            env.pop(name, None)
        server = _start_bus(tmp_path, port, password)
        services = _start_services(tmp_path, env)
        logs = [tmp_path / f"{n}.log" for n in ("sensor", "controller", "actuator")]
        logs += [tmp_path / f"agent-{n}.log" for n in NODES]
        logs += [StateDir(tmp_path / n).agent(n).service_log("replicator") for n in NODES]
        bus = None
        try:
            for node in NODES:
                _start_agent(network, node, tmp_path, url, env)
            bus = await Bus.connect(
                BusSettings(url=url, user="goodput", password=password), name="test"
            )
            await bus.provision()
            await _live(bus, set(NODES), 60)
            tap = await EventTap(bus, JOB).start()
            try:
                yield network, bus, tap
            except BaseException:
                print(_tails(logs + sorted(tmp_path.glob("host-*/agents/*/logs/ranks/*/*.log"))))
                raise
            finally:
                await tap.stop()
        finally:
            if bus is not None:
                await bus.close()
            stop(*services, *(p for h in network.hosts.values() for p in h.processes), timeout_s=30)
            stop(server, timeout_s=10)


async def test_a_lost_host_is_swapped_for_the_spare_which_restores_from_a_peer(
    tmp_path: Path,
) -> None:
    async with _three_hosts(tmp_path) as (network, bus, tap):
        start = _start(tmp_path)
        await bus.send_command("actuator", start)
        first = await _running(tap, start)
        # the collectives and the rendezvous are on the agents' addresses, not on loopback
        rank0 = _environ(first.pids["host-a"][0])
        assert rank0["MASTER_ADDR"] == network.hosts["host-a"].address
        assert {name: rank0[name] for name in VARIABLES} == dict.fromkeys(
            VARIABLES, network.interfaces["host-a"]
        )
        replicated = await _replicated_from_b(tap)
        spare_volume = node_volume(
            StateDir(tmp_path / "host-c").agent("host-c").root, "host-c", JOB
        )
        assert step_dirs(spare_volume) == []  # the spare never trained: nothing of its own
        for pid in network.pids("host-b"):  # the machine is gone: agent, daemons, ranks
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        await _swapped(tap, start)
        restored = [
            e for e in tap.of(schemas.CheckpointRestored) if e.node == "host-c" and e.rank == -1
        ]
        assert restored and restored[-1].step >= replicated.step, restored
        # the spare had nothing; what fills its volume crossed the network from host-a:
        # fetched by the restore ("peer"), or pushed by host-a's replicator once its peer
        # host-b was gone and taken by the restore from the copies the spare keeps for peers
        # ("local"); never the object store's
        last = restored[-1]
        assert last.tier in ("peer", "local") and last.bytes > 0, (last.tier, last.fallbacks)
        assert [step for step, _ in step_dirs(spare_volume)][:1] == [last.step]
        await _finished(tap, start, tmp_path)


async def test_a_partitioned_hosts_ranks_are_stopped_when_it_comes_back(tmp_path: Path) -> None:
    async with _three_hosts(tmp_path) as (network, bus, tap):
        start = _start(tmp_path)
        await bus.send_command("actuator", start)
        first = await _running(tap, start)
        await _replicated_from_b(tap)
        cut_off = first.pids["host-b"][0]
        network.cut("host-b")  # its agent, daemons and rank run on, unreachable
        await _swapped(tap, start)
        assert psutil.pid_exists(cut_off)
        network.cut("host-b", down=False)
        exited = await tap.wait_for(
            lambda e: isinstance(e, schemas.RankExited) and e.pid == cut_off,
            60,
            "the cut-off rank's exit once host-b is back",
        )
        # killed by the actuator's order once host-b's agent reported it again, not by chance
        assert (exited.node, exited.attempt, exited.signal) == ("host-b", first.attempt, 9)
        assert exited.expected_reason == STRAY_REASON
        await _finished(tap, start, tmp_path)


def _start(work: Path) -> schemas.StartJob:
    return schemas.StartJob(
        job=JOB,
        argv=[
            *("python", "-m", "goodput.examples.gpt.supervised", "--steps", str(STEPS)),
            *("--log-every", "0", "--result", str(work / "result.json")),
        ],
        nodes=2,
        procs_per_node=1,
        spares=1,
        env={"GOODPUT_CKPT_EVERY": "5"},  # each host's own volume: no GOODPUT_CKPT_DIR
    )


async def _running(tap: EventTap, start: schemas.StartJob) -> schemas.JobStatus:
    first = await tap.wait_for(
        _job_status(start.run_id, lambda e: e.state == "running"), 90, "the run's start"
    )
    assert (first.active_nodes, first.spare_nodes) == (["host-a", "host-b"], ["host-c"])
    return first


async def _replicated_from_b(tap: EventTap) -> schemas.CheckpointReplicated:
    return await tap.wait_for(
        lambda e: (
            isinstance(e, schemas.CheckpointReplicated)
            and e.node == "host-b"
            and e.step >= LOST_AFTER_STEP
        ),
        120,
        f"a checkpoint of host-b of step {LOST_AFTER_STEP} or later replicated to a peer",
    )


async def _swapped(tap: EventTap, start: schemas.StartJob) -> None:
    swapped = await tap.wait_for(
        _job_status(start.run_id, lambda e: "host-b" in e.failed_nodes and e.state == "running"),
        120,
        "host-b replaced",
    )
    assert swapped.active_nodes == ["host-a", "host-c"]
    assert any(d.rule == "hot-swap" for d in tap.of(schemas.Decision))


async def _finished(tap: EventTap, start: schemas.StartJob, work: Path) -> None:
    await tap.wait_for(
        _job_status(start.run_id, lambda e: e.state == "finished"), 150, "the run's end"
    )
    assert json.loads((work / "result.json").read_text())["steps"] == STEPS
