"""A JetStream cluster of three real nats-servers loses one while commands, events and the
controller's lease flow: nothing is lost, nothing runs twice, the lease moves at most once.

The server killed is the leader of the commands stream, the worst one to lose: that stream's
Raft group elects a new leader while commands are being published and consumed, and every
client connected to the dead server reconnects to a survivor.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import re
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import msgspec
import pytest

from goodput import schemas, subjects
from goodput.bus import Bus, BusSettings, DoneLog
from goodput.bus.cluster import EmbeddedCluster, cluster_refusal, cluster_size, stack_bus
from goodput.bus.embedded import (
    EmbeddedNatsError,
    EmbeddedRecord,
    RecordedBus,
    ServerRecord,
    read_record,
    write_record,
)
from goodput.bus.job_events import JobEvents
from goodput.owned_process import identify
from goodput.state_dir import StateDir
from goodput_services.controller.lease import Lease
from tests.bus.executor_process import TARGET, FileJob, runner
from tests.bus.samples import JOB

COMMANDS = 24
#: the lease's time to live: shorter than a leader election, so one may expire during it
LEASE_TTL_S = 3.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[EmbeddedCluster]:
    with EmbeddedCluster(StateDir(tmp_path / "nats")) as servers:
        yield servers


@pytest.fixture
async def cluster_bus(cluster: EmbeddedCluster) -> AsyncIterator[Bus]:
    bus = await Bus.connect(BusSettings(url=cluster.url), name="test")
    await bus.provision()
    yield bus
    await bus.close()


async def _leader(bus: Bus, stream: str) -> int:
    """The member leading ``stream``'s Raft group (``goodput-embedded-N``)."""
    info = await bus.js.stream_info(stream)
    assert info.cluster is not None and info.cluster.leader
    return int(info.cluster.leader.rsplit("-", 1)[1])


@pytest.mark.parametrize("size", ["2", "0", "three"])
def test_a_cluster_that_could_not_lose_a_server_is_refused_in_one_line(size: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="at least 3"):
        cluster_size(size)
    assert cluster_size("1") == 1 and cluster_size("5") == 5


def test_a_cluster_is_refused_where_it_cannot_be_honoured() -> None:
    assert cluster_refusal(3, explicit_url=False) == ""  # it will be started
    assert "drop it or --nats-url" in cluster_refusal(3, explicit_url=True)
    assert "already runs 1 embedded NATS server" in cluster_refusal(
        3, explicit_url=False, running=1
    )
    assert cluster_refusal(3, explicit_url=False, running=3) == ""
    assert cluster_refusal(1, explicit_url=True, running=1) == ""


def test_the_stack_bus_refuses_a_running_bus_of_another_size(tmp_path: Path) -> None:
    """The running bus is read from the record once; this process stands in for its server.
    The caller's bus comes first, and a cluster is refused on it."""
    paths = StateDir(tmp_path)
    server = ServerRecord(
        process=identify(os.getpid()), port=1, url="nats://127.0.0.1:1", store_dir="s"
    )
    write_record(paths, EmbeddedRecord(servers=[server]))
    found = RecordedBus.read(paths)
    assert found.running and found.url == "nats://127.0.0.1:1"
    with pytest.raises(
        EmbeddedNatsError, match=re.escape(f"{tmp_path}: it already runs 1 embedded NATS")
    ):
        stack_bus(paths, size=3)
    bus = stack_bus(paths, size=1)
    assert (bus.url, bus.started, bus.stale) == ("nats://127.0.0.1:1", "", [])
    assert read_record(paths) == EmbeddedRecord(servers=[server]), "nothing started"
    theirs = "nats://10.0.0.7:4222"
    assert stack_bus(paths, explicit_url=theirs).url == theirs
    with pytest.raises(EmbeddedNatsError, match="drop it or --nats-url"):
        stack_bus(paths, size=3, explicit_url=theirs)


async def _contend(leases: list[Lease], holders: list[str], stop: asyncio.Event) -> None:
    """Both controllers try the lease every ttl/3, as the controller does; who holds it after
    each round is appended (``""``: nobody could write it)."""
    while not stop.is_set():
        held = []
        for lease in leases:
            with contextlib.suppress(Exception):  # the bus is electing: nobody leads
                if await asyncio.wait_for(lease.acquire_or_renew(time.time_ns()), 5):
                    held.append(lease.holder)
        assert len(held) <= 1, f"two holders at once: {held}"
        holders.append(held[0] if held else "")
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), LEASE_TTL_S / 3)


async def test_losing_the_commands_leader_loses_and_repeats_nothing(
    cluster: EmbeddedCluster, cluster_bus: Bus, tmp_path: Path
) -> None:
    executor_bus = await Bus.connect(BusSettings(url=cluster.url), name="executor")
    lease_buses = [
        await Bus.connect(BusSettings(url=cluster.url), name=f"controller-{i}") for i in range(2)
    ]
    job = FileJob(tmp_path / "job.json")
    command_runner = runner(executor_bus, job)
    executing = asyncio.create_task(command_runner.run())
    follower = await JobEvents(cluster_bus, JOB, all_runs=True).start()
    leases = [
        Lease(bus, JOB, "controller", f"controller-{i}", LEASE_TTL_S)
        for i, bus in enumerate(lease_buses)
    ]
    holders: list[str] = []
    stop_leases = asyncio.Event()
    contending = asyncio.create_task(_contend(leases, holders, stop_leases))
    sent: list[str] = []
    try:
        for stream in (subjects.COMMANDS_STREAM, f"KV_{subjects.LEASES_BUCKET}"):
            info = await cluster_bus.js.stream_info(stream)
            assert info.config.num_replicas == 3, "R3 on a clustered server"
            assert info.cluster is not None and len(info.cluster.replicas or []) == 2
        victim = await _leader(cluster_bus, subjects.COMMANDS_STREAM)
        for i in range(COMMANDS):
            if i == COMMANDS // 3:
                await asyncio.to_thread(cluster.kill, victim)
            command = schemas.Restart(job=JOB, reason=f"command {i}")
            await cluster_bus.send_command(TARGET, command)
            await cluster_bus.emit(
                schemas.StepDone(
                    job=JOB, node="node-0", rank=0, step=i, step_time_s=0.1, tokens=1, loss=1.0
                )
            )
            sent.append(command.command_id)
            await asyncio.sleep(0.05)
        done = DoneLog(cluster_bus, JOB, TARGET)
        deadline = time.monotonic() + 60
        while len(job.executed) < COMMANDS or await done.result(sent[-1]) is None:
            assert time.monotonic() < deadline, f"{len(job.executed)} of {COMMANDS} executed"
            await asyncio.sleep(0.1)
        await follower.wait_for(lambda e: getattr(e, "step", -1) == COMMANDS - 1, 30, "last step")
        # a few more rounds of the lease, until one ends held: a round where the holder's
        # renewal is slow (its connection moving to a survivor) is held by nobody
        rounds, deadline = len(holders), time.monotonic() + 30
        while len(holders) < rounds + 3 or not holders[-1]:
            assert time.monotonic() < deadline, f"nobody leads after: {holders[rounds:]}"
            await asyncio.sleep(0.05)
        settled = holders[:]
    finally:
        stop_leases.set()
        command_runner.stop()
        await asyncio.wait_for(asyncio.gather(contending, executing), 15)
        await follower.stop()
        for bus in (executor_bus, *lease_buses):
            await bus.close()
    assert job.executed == sent, "every command executed once, in order"
    assert command_runner.not_repeated == 0
    assert [e.step for e in follower.of(schemas.StepDone)] == list(range(COMMANDS))
    assert settled[0] and settled[-1], f"a controller leads before and after: {settled}"
    held = [holder for holder in holders if holder]
    moves = [b for a, b in itertools.pairwise(held) if a != b]
    assert len(moves) <= 1, f"the lease moved {len(moves)} times: {holders}"


def test_the_record_of_a_server_started_before_clusters_still_reads(tmp_path: Path) -> None:
    """`goodput up`/`down` after an upgrade find the server an older release started."""
    old = {"pid": 1234, "port": 4222, "url": "nats://127.0.0.1:4222", "store_dir": "s"}
    StateDir(tmp_path).nats_record.write_bytes(msgspec.json.encode(old))
    record = read_record(StateDir(tmp_path))
    assert record is not None and record.url == old["url"] and record.pids == [1234]
    assert not record.cluster_ports
