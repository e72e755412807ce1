"""A local launch that fails part-way (issue 41, "Bounds"): the actuator names the cause in
its ActionResult and stops every rank it had started, so nothing is left running.

Both failures are real: a log file that cannot be opened (mid-way, after two ranks started),
and an actuator whose threads cannot start (its ``RLIMIT_AS`` lowered to what it maps now:
a thread's stack is refused, fork is not), which is what a fork bomb of ranks used to hit.
"""

from __future__ import annotations

import asyncio
import json
import resource
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from goodput import schemas
from goodput.bus import Bus, BusSettings, EmbeddedNats
from goodput.bus.embedded import pid_alive
from goodput.launch.rank_logs import rank_log
from goodput.state_dir import StateDir
from tests.processes import stop
from tests.stack.helpers import EventTap

JOB = "job-launch-fail"
RANK = "import sys, time\ntime.sleep(600)\n"


def _actuator(server: EmbeddedNats, state_dir: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "goodput_services.actuator", "--job", JOB, "--nats-url",
         server.url, "--state-dir", str(state_dir), "--set", "restore_timeout_s=0"],
        stdout=subprocess.DEVNULL,
        stderr=open(state_dir / "actuator.log", "ab"),
    )  # fmt: skip


def _starve_threads(pid: int) -> None:
    """No new thread fits in ``pid`` any more: its address space may grow by 2 MiB less than
    a thread's stack (glibc's default: ``RLIMIT_STACK``, 32 MiB when unlimited); fork copies
    what is mapped and is not refused."""
    stack, _ = resource.prlimit(pid, resource.RLIMIT_STACK)
    stack = 32 * 2**20 if stack == resource.RLIM_INFINITY else stack
    status = Path(f"/proc/{pid}/status").read_text()
    mapped_kib = int(
        next(line for line in status.splitlines() if line.startswith("VmSize:")).split()[1]
    )
    limit = mapped_kib * 1024 + stack - 2 * 2**20
    resource.prlimit(pid, resource.RLIMIT_AS, (limit, limit))


@pytest.fixture
async def tap(nats_server: EmbeddedNats) -> AsyncIterator[tuple[Bus, EventTap]]:
    bus = await Bus.connect(BusSettings(url=nats_server.url), name="test")
    await bus.provision()
    events = await EventTap(bus, JOB).start()
    yield bus, events
    await events.stop()
    await bus.close()


def _start(marker: str, nodes: int, procs: int) -> schemas.StartJob:
    # the marker names this test's ranks among every process of the machine
    return schemas.StartJob(
        job=JOB,
        argv=[sys.executable, "-c", RANK, marker],
        nodes=nodes,
        procs_per_node=procs,
        spares=0,
    )


def _running(marker: str) -> list[int]:
    """Live processes whose command line carries ``marker`` (zombies are not running)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker.encode() in cmdline.split(b"\0") and state != "Z":
            found.append(int(entry.name))
    return found


def _recorded_pids(state_dir: Path) -> dict:
    """What `goodput down` would stop if the actuator were gone (its ranks file)."""
    return json.loads(StateDir(state_dir).ranks_record(JOB).read_text())


async def test_a_launch_failing_mid_way_stops_the_ranks_it_started(
    tap, nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    bus, events = tap
    # rank 2's log cannot be opened: ranks 0 and 1 are running when its start fails
    rank_log(tmp_path, 1, "node-1", 2).mkdir(parents=True)
    actuator = _actuator(nats_server, tmp_path)
    try:
        start = _start("midway-" + schemas.new_id(), nodes=2, procs=2)
        await bus.send_command("actuator", start)
        result = await events.result_of(start, timeout_s=60)
        assert not result.ok
        assert "after starting 2 of 4 rank(s): IsADirectoryError" in result.detail, result.detail
        assert result.detail.endswith("; stopped 2 started")
        assert _recorded_pids(tmp_path) == {}
        started = [e.pid for e in events.of(schemas.RankStarted)]
        assert len(started) == 2
        await asyncio.sleep(0.5)
        assert not [pid for pid in started if pid_alive(pid)]
        assert _running(start.argv[-1]) == []
        assert actuator.poll() is None  # a failed launch is a result, not a crash
    finally:
        stop(actuator, timeout_s=90)


async def test_a_rank_forked_without_a_watcher_thread_is_not_left_running(
    tap, nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    """asyncio forks the rank, then fails to start the thread that would wait for it: the
    call raises with the child running and its pid lost (what `--procs-per-node 100000` hit)."""
    bus, events = tap
    actuator = _actuator(nats_server, tmp_path)
    try:
        # a refused start: the actuator is up and consuming, its threads all started
        shapeless = _start("shapeless", nodes=0, procs=1)
        await bus.send_command("actuator", shapeless)
        assert not (await events.result_of(shapeless, timeout_s=60)).ok
        _starve_threads(actuator.pid)
        # glibc reuses the stacks of threads that ended (a few): the ranks after those fail
        start = _start("nothread-" + schemas.new_id(), nodes=2, procs=6)
        await bus.send_command("actuator", start)
        result = await events.result_of(start, timeout_s=60)
        assert not result.ok
        assert "of 12 rank(s): RuntimeError: can't start new thread" in result.detail, result.detail
        assert result.detail.endswith(" started and 1 half-started")
        assert _recorded_pids(tmp_path) == {}
        assert _running(start.argv[-1]) == []
        assert actuator.poll() is None
        assert child_pids_of(actuator.pid) == set()
    finally:
        stop(actuator, timeout_s=90)


def child_pids_of(pid: int) -> set[int]:
    """``pid``'s children, as ``goodput_services.actuator.strays`` reads its own."""
    children: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        children.update(int(c) for c in (task / "children").read_text().split())
    return children


async def test_a_start_job_past_the_bounds_from_the_bus_is_refused_before_a_fork(
    tap, nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    """`goodput run` refuses the shape; the actuator refuses it again from anyone else."""
    bus, events = tap
    actuator = _actuator(nats_server, tmp_path)
    try:
        huge = _start("huge", nodes=1, procs=100_000)
        await bus.send_command("actuator", huge)
        result = await events.result_of(huge, timeout_s=60)
        assert not result.ok and "100000 ranks per node exceed the maximum of 64" in result.detail
        # within the maxima, past this machine: 4,000 processes of 512 MiB each
        wide = _start("wide", nodes=1000, procs=4)
        await bus.send_command("actuator", wide)
        result = await events.result_of(wide, timeout_s=60)
        assert not result.ok and "this machine cannot run the job" in result.detail
        assert events.of(schemas.RankStarted) == [] and events.of(schemas.RunStarted) == []
    finally:
        stop(actuator, timeout_s=90)
