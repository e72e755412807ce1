"""The node daemons a node agent runs: the real host monitor and replicator against a real
nats-server, restarted when they die, stopped with the agent, a refusal ending it in one line,
and what an earlier agent left stopped only when it is still that agent's."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import psutil
import pytest

from goodput.bus import Bus, BusSettings
from goodput.bus.embedded import EmbeddedNats
from goodput.bus.service_health import read_records
from goodput.bus.settings import settings_to_env
from goodput.checkpoint.format import node_volume
from goodput.checkpoint.tiers.peer.address import ADVERTISE_HOST_ENV
from goodput.owned_process import identify
from goodput.state_dir import StateDir
from goodput.supervisor.agent.daemons import (
    DAEMONS,
    DaemonRefused,
    DaemonSettings,
    NodeDaemons,
    daemon_command,
    daemon_env,
    stop_leftovers,
)
from tests.processes import kill

JOB = "daemonjob"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _settings(tmp_path: Path, config: str = "") -> DaemonSettings:
    return DaemonSettings(
        job=JOB,
        node="n0",
        state_dir=tmp_path / "agents" / "n0",
        address="127.0.0.1",
        peer_port=_free_port(),
        config=config,
    )


async def _until(read, what: str, wanted, timeout_s: float = 60.0) -> None:
    """``await read()`` again until it returns ``wanted`` (or ``wanted(value)`` holds)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(Exception):  # a bucket not made yet, a record being written
            value = await read()
            if wanted(value) if callable(wanted) else value == wanted:
                return
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        await asyncio.sleep(0.2)


async def _replicator_pid(daemons: NodeDaemons) -> int | None:
    process = daemons.processes["replicator"]
    return process.pid if process.returncode is None else None


async def _healthy(bus: Bus) -> set[str]:
    """The node daemons of n0 with a health record on the bus."""
    records, _ = await read_records(bus, JOB)
    return {r.service for r in records if r.node == "n0" and r.healthy}


def test_each_daemon_serves_the_agents_node_volume_and_address_with_no_secret_on_its_line(
    tmp_path: Path,
) -> None:
    settings = _settings(tmp_path)
    bus_env = settings_to_env(BusSettings(url="nats://10.0.0.1:4222", password="s3cret"))
    for name in DAEMONS:
        command = daemon_command(name, settings)
        assert command[1:3] == ["-m", f"goodput_services.{name}"]
        assert command[command.index("--state-dir") + 1] == str(settings.state_dir)
        assert command[command.index("--node") + 1] == "n0"
        assert not any("s3cret" in part for part in command)
        env = daemon_env(name, settings, {"PATH": "/bin"}, bus_env)
        assert "s3cret" in env.values() and env["PATH"] == "/bin"
    replicator = daemon_command("replicator", settings)
    assert 'host="127.0.0.1"' in replicator and f"port={settings.peer_port}" in replicator
    assert daemon_env("replicator", settings, {}, bus_env)[ADVERTISE_HOST_ENV] == "127.0.0.1"
    assert ADVERTISE_HOST_ENV not in daemon_env("hostmon", settings, {}, bus_env)


@pytest.mark.slow
async def test_the_daemons_run_are_restarted_when_they_die_and_stop_with_the_agent(
    bus: Bus, nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    settings = _settings(tmp_path)
    daemons = NodeDaemons(settings, settings_to_env(BusSettings(url=nats_server.url)))
    running = asyncio.create_task(daemons.run())
    try:
        await _until(lambda: _healthy(bus), "both daemons healthy", set(DAEMONS))
        # the replicator's peer data plane is on the agent's address and port
        with socket.create_connection(("127.0.0.1", settings.peer_port), timeout=5):
            pass
        assert StateDir(settings.state_dir).daemons_record.exists()
        first = daemons.processes["replicator"].pid
        os.kill(first, signal.SIGKILL)
        await _until(
            lambda: _replicator_pid(daemons),
            "the replicator started again",
            lambda p: p not in (None, first),
        )
        assert not running.done()
        # what the daemons watch is the ranks' volume under the agent's state directory
        hostmon = psutil.Process(daemons.processes["hostmon"].pid).cmdline()
        assert hostmon[hostmon.index("--state-dir") + 1] == str(settings.state_dir)
        assert node_volume(settings.state_dir, "n0", JOB).parent.parent.exists()
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        pids = [p.pid for p in daemons.processes.values()]
        await asyncio.wait_for(daemons.stop(25), 40)
    assert all(not psutil.pid_exists(pid) for pid in pids)
    assert not StateDir(settings.state_dir).daemons_record.exists()


@pytest.mark.slow
async def test_a_daemon_refusing_its_configuration_ends_the_run_in_one_line(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    config = tmp_path / "goodput.toml"
    config.write_text("[services.replicator]\nkeep_locl = 3\n")
    daemons = NodeDaemons(
        _settings(tmp_path, str(config)), settings_to_env(BusSettings(url=nats_server.url))
    )
    try:
        with pytest.raises(DaemonRefused) as refused:
            await asyncio.wait_for(daemons.run(), 60)
    finally:
        await asyncio.wait_for(daemons.stop(25), 40)
    line = str(refused.value)
    assert "\n" not in line and "replicator of n0 refused to start" in line
    assert "keep_locl" in line


def test_an_earlier_agents_daemon_is_stopped_and_a_recycled_pid_is_not(tmp_path: Path) -> None:
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    left = subprocess.Popen(sleeper, start_new_session=True)
    other = subprocess.Popen(sleeper)
    try:
        deadline = time.monotonic() + 10
        while len(psutil.Process(left.pid).cmdline()) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        mine = identify(left.pid)
        # the pid of the other process, recorded with another command line: not the daemon
        recycled = msgspec.structs.replace(identify(other.pid), cmdline=("goodput-replicator",))
        record = StateDir(tmp_path).daemons_record
        record.write_bytes(msgspec.json.encode([mine, recycled]))
        said = stop_leftovers(tmp_path, timeout_s=10)
        assert left.wait(timeout=10) is not None
        assert other.poll() is None
        assert any("stopped" in line and str(left.pid) in line for line in said)
        assert any("held by another process" in line for line in said)
        assert not record.exists()
        # a record cut short by a crash names nothing
        record.write_text('[{"pid": 1')
        assert stop_leftovers(tmp_path) == []
    finally:
        kill(left, other)
